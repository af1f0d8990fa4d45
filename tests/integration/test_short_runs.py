"""A first run is short: its evaluation is proportionate to it, a long scoring says how far
it got, and a throughput that was not measured is said to be so, not printed as 0."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from hetero import trainer as ht
from hetero.core.catalogue import TrainingOptions
from hetero.trainer import report
from hetero.trainer.cli import main

TWO_STEPS = ["--model", "debug", "--global-batch", "4", "--steps", "2", "--ideal-steps", "1"]


def test_the_default_evaluation_scores_no_more_samples_than_the_run_trains_on() -> None:
    assert TrainingOptions().eval_samples_for(8) == 8
    assert TrainingOptions().eval_samples_for(10**6) == 512
    assert TrainingOptions(eval_samples=100).eval_samples_for(8) == 100
    assert TrainingOptions(eval_samples=0).eval_samples_for(8) == 0


def test_a_run_shorter_than_an_interval_says_its_throughput_was_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary_path = tmp_path / "summary.json"
    assert main([*TWO_STEPS, "--summary-json", str(summary_path)]) == 0
    out = capsys.readouterr().out
    assert "throughput" in out and "not measured: 2 steps ran" in out, out
    assert "% of ideal" not in out, out
    summary = json.loads(summary_path.read_text())
    assert summary["eval_samples"] == 8  # 2 steps x 4 samples, not 512
    assert summary["pct_of_ideal"] is None


def test_a_run_shorter_than_an_interval_shows_its_last_step_and_the_ideal_measurement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(TWO_STEPS) == 0
    out = capsys.readouterr().out
    assert "step      2/2  plan [4]" in out and "no whole rebalance interval of 10 steps" in out
    assert "measuring the ideal: each rank alone for 1 steps" in out, out
    assert out.index("step      2/2") < out.index("measuring the ideal") < out.index("final plan")


def test_a_long_evaluation_says_how_far_it_got(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(report, "EVAL_QUIET_S", 0.0)
    monkeypatch.setattr(report, "EVAL_PROGRESS_S", 0.0)
    assert main([*TWO_STEPS, "--eval-samples", "12", "--ideal-steps", "0"]) == 0
    out = capsys.readouterr().out
    assert "evaluating on rank 0: 4/12 samples" in out and "12/12 samples" in out, out
    assert "ideal" in out and "not measured (--ideal-steps 0)" in out, out


def test_the_ideal_runs_no_more_steps_a_rank_than_the_run_trained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 2-step smoke test measured the ideal for the default 8 steps a rank (10 with the
    warm-up): ten times its own length. Now at most the steps it trained."""
    assert main(["--model", "debug", "--global-batch", "4", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "measuring the ideal: each rank alone for 2 steps" in out, out
    assert report.ideal_steps(TrainingOptions(), 2) == 2
    assert report.ideal_steps(TrainingOptions(), 1000) == 8
    assert report.ideal_steps(TrainingOptions(ideal_steps=0), 1000) == 0


def test_ctx_report_of_a_run_shorter_than_an_interval_names_what_was_not_measured() -> None:
    ctx = ht.init("equal", device="cpu", rebalance_interval=10)
    try:
        model = ctx.wrap(torch.nn.Linear(2, 1))
        loader = ctx.loader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), 4)
        for x, y in loader:
            ctx.backward(torch.nn.functional.mse_loss(model(x), y))
            ctx.step()
            if ctx.global_step == 2:
                break
        out = io.StringIO()
        summary = ctx.report(file=out)
    finally:
        ctx.close()
    assert summary["pct_of_ideal"] is None
    assert "throughput not measured: 2 steps ran" in out.getvalue(), out.getvalue()
    assert "0.0 samples/s" not in out.getvalue()
