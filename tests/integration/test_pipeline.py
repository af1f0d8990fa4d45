"""Pipeline stages on Gloo (``hetero.trainer.pipeline``): uneven stages, and replicas of
them given uneven shares of each global batch, train exactly as one process over the same
global batch."""

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
    [
        ("bounds=0,4,6", "schedule=1f1b"),
        ("bounds=0,1,4,6", "schedule=1f1b"),
        ("bounds=0,2,3,6", "schedule=gpipe"),
        ("bounds=0,1,4,6", "schedule=1f1b", "resume=0,4,5,6"),
        ("bounds=0,4,6", "schedule=1f1b", "shares=6,2"),
        ("bounds=0,4,6", "schedule=1f1b", "shares=6,2", "resume=0,1,6"),
        ("bounds=0,2,6", "schedule=1f1b", "model=user", "resume=0,5,6"),
    ],
    ids=[
        "2-stages-4+2-1f1b",
        "3-stages-1+3+2-1f1b",
        "3-stages-2+1+3-gpipe",
        "3-stages-1+3+2-resumed-as-4+1+1",
        "2-replicas-of-6-and-2-samples-x-2-stages-4+2",
        "2-replicas-x-2-stages-4+2-resumed-as-1+5",
        "a-users-tied-model-traced-2+4-resumed-as-5+1",
    ],
)
def test_uneven_stages_and_replicas_give_one_process_losses_and_parameters(
    run_ranks, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """A resumed case checkpoints after two steps and resumes the third on another split:
    the parameters and the SGD momentum move between ranks, and nothing changes."""
    opts = dict(a.split("=", 1) for a in args)
    stages = opts["bounds"].count(",")
    shares = [int(s) for s in opts.get("shares", str(worker.GLOBAL_BATCH)).split(",")]
    ranks_n = stages * len(shares)
    out = tmp_path / "run"
    run_ranks("pipeline_equivalence.py", ranks_n, str(out), *args)
    ranks = [torch.load(f"{out}.rank{r}") for r in range(ranks_n)]
    kind = opts.get("model", "gpt2")
    losses, params = worker.reference(kind)
    tied = "embed.weight" if kind == "user" else "tok_emb.weight"
    # The global batch's mean loss: each replica's mean weighted by its share.
    lasts = [ranks[(k + 1) * stages - 1]["losses"] for k in range(len(shares))]
    got = [
        sum(b * lasts[k][step] for k, b in enumerate(shares)) / worker.GLOBAL_BATCH
        for step in range(worker.STEPS)
    ]
    assert got == pytest.approx(losses, rel=1e-5)
    for k in range(len(shares)):
        held = [name for r in ranks[k * stages : (k + 1) * stages] for name in r["params"]]
        # Every parameter is held once, but the tied embedding by the first and last stage.
        assert set(held) <= set(params) and set(params) - set(held) <= {"head.weight"}
        assert (
            sum(
                1
                for r in ranks[k * stages : (k + 1) * stages]
                if tied in r["params"] or "head.weight" in r["params"]
            )
            == 2
        )
    for r in ranks:
        for name, value in r["params"].items():
            torch.testing.assert_close(value, params[name], rtol=1e-4, atol=1e-5)


_ctx_spec = importlib.util.spec_from_file_location(
    "pipeline_context_worker", Path(__file__).parent / "workers" / "pipeline_context.py"
)
assert _ctx_spec and _ctx_spec.loader
ctx_worker = importlib.util.module_from_spec(_ctx_spec)
_ctx_spec.loader.exec_module(ctx_worker)


def test_a_training_loop_with_uneven_replicas_recut_at_a_checkpoint_trains_as_one_process(
    run_ranks, tmp_path: Path
) -> None:
    """ctx.wrap(model, pipeline=2) on 4 Gloo ranks: replicas given 12 and 4 samples, the
    stages re-cut after stage 1 slowed down (EMULATED), the losses and parameters are one
    process's over the same global batches."""
    out = tmp_path / "loop"
    run_ranks("pipeline_context.py", 4, str(out))
    ranks = [torch.load(f"{out}.rank{r}") for r in range(4)]
    losses, params = ctx_worker.reference()
    assert ranks[0]["plan"] == list(ctx_worker.PLAN)
    # Re-cut: the slowed stage 1 gives blocks to stage 0.
    before, *after = ranks[0]["splits"]
    assert before == (0, 3, 6)
    assert len(after) == 1 and after[0][1] > 3, ranks[0]["moves"]
    lasts = [ranks[1]["losses"], ranks[3]["losses"]]
    got = [
        sum(b * lasts[k][step] for k, b in enumerate(ctx_worker.PLAN)) / ctx_worker.GLOBAL_BATCH
        for step in range(ctx_worker.STEPS)
    ]
    assert got == pytest.approx(losses, rel=1e-5)
    for r in ranks:
        for name, value in r["params"].items():
            torch.testing.assert_close(value, params[name], rtol=1e-4, atol=1e-5)


def test_the_benchmark_writes_its_raw_intervals_and_summary_on_cpu(tmp_path: Path) -> None:
    """``python -m hetero.bench.pipeline`` on a tiny model, EMULATED: the three runs (even,
    speed-sized, the re-cut from the even run's speeds), their predicted and measured
    stage times, the ratio and the ideal, and the raw records."""
    import gzip
    import json
    import subprocess
    import sys

    out = tmp_path / "bench"
    args = ["--model", "gpt2-tiny", "--layers", "4", "--slowdown", "1,2", "--steps", "2"]
    args += ["--warmup", "1", "--microbatches", "4", "--interval", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "hetero.bench.pipeline", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith("EMULATED") for line in lines[:-1]), done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"even", "speed-sized", "re-cut"}
    assert summary["runs"]["even"]["blocks"] == [2, 2]
    assert summary["runs"]["re-cut"]["blocks"] == summary["recut_blocks"]
    assert summary["emulated"] and summary["speed_sized_over_even"] > 0
    assert summary["pct_of_ideal"] > 0
    with gzip.open(out / "intervals.jsonl.gz", "rt") as fh:
        records = [json.loads(line) for line in fh]
    runs = ["even", "even", "speed-sized", "speed-sized", "re-cut", "re-cut"]
    assert [r["run"] for r in records] == runs
    assert all(len(r["stage_s_per_microbatch"]) == 2 for r in records)
