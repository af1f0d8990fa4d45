"""Pipeline stages on Gloo (``hetero.trainer.pipeline``): uneven stages train exactly as
one process over the same global batch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "pipeline_worker", Path(__file__).parent / "workers" / "pipeline_equivalence.py"
)
assert _spec and _spec.loader
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("args"),
    [("0,4,6", "1f1b"), ("0,1,4,6", "1f1b"), ("0,2,3,6", "gpipe"), ("0,1,4,6", "1f1b", "0,4,5,6")],
    ids=[
        "2-stages-4+2-1f1b",
        "3-stages-1+3+2-1f1b",
        "3-stages-2+1+3-gpipe",
        "3-stages-1+3+2-resumed-as-4+1+1",
    ],
)
def test_uneven_stages_give_one_process_losses_and_parameters(
    run_ranks, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """The last case checkpoints after two steps and resumes the third on another split:
    the parameters and the SGD momentum move between ranks, and nothing changes."""
    stages = args[0].count(",")
    out = tmp_path / "run"
    run_ranks("pipeline_equivalence.py", stages, str(out), *args)
    ranks = [torch.load(f"{out}.rank{r}") for r in range(stages)]
    losses, params = worker.reference()
    assert ranks[-1]["losses"] == pytest.approx(losses, rel=1e-5)
    held = [name for r in ranks for name in r["params"]]
    # Every parameter is held once, but the tied embedding by the first and last stage.
    assert sorted(set(held)) == sorted(params)
    assert held.count("tok_emb.weight") == 2
    for r in ranks:
        for name, value in r["params"].items():
            torch.testing.assert_close(value, params[name], rtol=1e-4, atol=1e-5)
