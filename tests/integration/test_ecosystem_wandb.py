"""hetero's interval figures in Weights & Biases, through docs/trainer.md's own lines
(``flat`` and the W&B ``ctx.on_interval`` example, executed as written), W&B offline
under the test's directory, its run log read back by W&B's own reader (``wandb leet
inspect``).

Marked ``ecosystem``: ``make test-ecosystem`` installs wandb (pyproject's ``ecosystem``
extra) and runs it; without wandb the module skips in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from docscode import run_logging_example

wandb: Any = pytest.importorskip(
    "wandb", reason="wandb is not installed (make test-ecosystem installs it)"
)

pytestmark = pytest.mark.ecosystem


def test_weights_and_biases_offline_gets_each_boundarys_figures_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",  # leave pytest's capture of stdout alone
    }.items():
        monkeypatch.setenv(name, value)
    try:
        logged = run_logging_example("Weights", wandb)
        run_dir = Path(wandb.run.dir).parent
    finally:
        wandb.finish()
        wandb.teardown()
    inspect = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    records = [json.loads(line) for line in inspect.stdout.splitlines()]
    history = [
        (
            int(r["history"]["step"]["num"]),
            {k: v for k, v in r["history"]["item"].items() if not k.startswith("_")},
        )
        for r in records
        if r["type"] == "history"
    ]
    assert history == logged
