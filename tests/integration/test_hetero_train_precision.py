"""hetero-train's --amp bf16 and --channels-last: they train, the summary says so, bad values fail."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetero.core.errors import ConfigError
from hetero.trainer.job import JobConfig


def test_amp_must_be_a_known_mode() -> None:
    with pytest.raises(ConfigError, match=r"amp: unknown value 'fp8' \(known: none, bf16, fp16\)"):
        JobConfig(model="debug", amp="fp8")


@pytest.mark.slow
def test_bf16_channels_last_run_trains_and_reports_its_precision(hetero_train, tmp_path: Path):
    summary = tmp_path / "summary.json"
    proc = hetero_train(
        "--model",
        "simple_cnn",
        "--num-samples",
        "256",
        "--global-batch",
        "32",
        "--steps",
        "6",
        "--rebalance-interval",
        "3",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--backend",
        "gloo",
        "--amp",
        "bf16",
        "--channels-last",
        "--ideal-steps",
        "1",
        "--summary-json",
        str(summary),
        "--json",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(summary.read_text())
    assert s["amp"] == "bf16" and s["channels_last"] is True and s["backend"] == "gloo"
    assert s["steps"] == 6 and math.isfinite(s["loss_last"])
    assert s["ideal_samples_per_s"] > 0
