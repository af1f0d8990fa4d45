"""``ctx.evaluate``: an evaluation is recorded for the run's view and TensorBoard, and its
time is not training time. One process, a real model, real files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from hetero import trainer as ht
from hetero.core.errors import ConfigError
from hetero.tui.runfiles import RunFollower
from hetero.tui.runview import run_view

EVAL_S = 0.4

pytestmark = pytest.mark.slow


def _train(tmp_path: Path, evaluate_at: int) -> ht.Context:
    ctx = ht.init("equal", rebalance_interval=5, device="cpu", output_dir=str(tmp_path))
    model = ctx.wrap(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(160, 4), torch.randint(0, 2, (160,)))
    loader = ctx.loader(data, global_batch=8)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        ctx.backward(loss)
        opt.step()
        opt.zero_grad()
        ctx.step(loss)
        if ctx.global_step == evaluate_at:

            def slow_eval() -> dict[str, object]:
                time.sleep(EVAL_S)
                return {"accuracy": torch.tensor(0.75), "loss": 0.5, "nan": float("nan")}

            assert ctx.evaluate(slow_eval) == {"accuracy": 0.75, "loss": 0.5}
        if ctx.global_step == 10:
            break
    return ctx


def test_an_evaluation_is_recorded_and_left_out_of_the_interval_wall_time(tmp_path: Path) -> None:
    ctx = _train(tmp_path, evaluate_at=7)
    ctx.close()
    records = [
        json.loads(x) for x in (tmp_path / "metrics" / "rank0.jsonl").read_text().splitlines()
    ]
    second = next(r for r in records if r["step"] == 10)
    # Five steps of a 4x2 linear model take milliseconds; the evaluation slept 0.4 s.
    assert second["interval_wall_s"] < EVAL_S / 2, second["interval_wall_s"]
    assert second["phases_s"]["data"] < EVAL_S / 10, "the evaluation counted as input wait"
    (evaluation,) = [
        json.loads(x) for x in (tmp_path / "metrics" / "eval.jsonl").read_text().splitlines()
    ]
    assert evaluation["step"] == 7 and evaluation["eval_s"] >= EVAL_S
    assert evaluation["metrics"] == {"accuracy": 0.75, "loss": 0.5}
    run = json.loads((tmp_path / "metrics" / "run.json").read_text())
    assert run["policy"] == "equal" and run["world_size"] == 1 and run["ended_unix_s"]
    view = run_view(RunFollower(tmp_path).poll(), time.time())
    assert view.status == "finished" and dict(view.evals)["accuracy"] == ((7, 0.75),)


def test_an_evaluation_that_returns_no_numbers_is_one_line_error(tmp_path: Path) -> None:
    ctx = ht.init("equal", device="cpu", output_dir=str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="metric 'accuracy' is 'high', not a number"):
            ctx.evaluate(lambda: {"accuracy": "high"})
        with pytest.raises(ConfigError, match="returned list, not a mapping"):
            ctx.evaluate(lambda: [0.5])
    finally:
        ctx.close()
