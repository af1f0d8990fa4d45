"""FSDP2 with uneven batches on real Gloo ranks: exact gradients and compute-only timing."""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from hetero.trainer.checkpoint import read_checkpoint
from hetero.trainer.metrics import read_metrics

_spec = importlib.util.spec_from_file_location(
    "equivalence_worker", Path(__file__).parent / "workers" / "equivalence.py"
)
assert _spec and _spec.loader
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

pytestmark = pytest.mark.slow

MODES = ["shard-full", "shard-plain", "shard-offload", "shard-dynamic", "shard-recompute"]


@pytest.fixture(scope="module")
def sharded_runs(ranks_in_turn, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """equivalence.py's sharded modes on 3 ranks, one after another on one launch (each a
    job of its own: ``workers/in_turn.py``); mode ``MODE`` wrote ``MODE.pt``."""
    out = tmp_path_factory.mktemp("sharded-equivalence")
    ranks_in_turn(out, 3, [["equivalence.py", str(out / f"{mode}.pt"), mode] for mode in MODES])
    return out


@pytest.mark.timeout(900)  # four FSDP2 jobs on Gloo: minutes on a loaded 2-core host
@pytest.mark.parametrize("mode", MODES)
def test_sharded_uneven_training_equals_single_process_over_the_global_batch(
    sharded_runs: Path, mode: str
):
    """FSDP2 reduce-scatters Σ_i (b_i/B) g_i: after 12 steps of SGD with momentum under
    plans that change mid-run, the parameters are one process's to the DDP test's 1e-5."""
    out = sharded_runs / f"{mode}.pt"
    got = torch.load(out)
    sizes = [torch.load(f"{out}.rank{r}.sizes") for r in range(3)]
    assert all(sum(s) == 24 for s in zip(*sizes, strict=True))
    if mode == "shard-dynamic":
        # Compute-only timing through FSDP2's collectives: the planner's first move took
        # samples off the 30x-slow rank 2, and steps ran uneven.
        assert len(got["plans"]) > 1 and got["plans"][1][2] < 8, got["plans"]
        assert any(len(set(s)) > 1 for s in zip(*sizes, strict=True))
    else:
        assert sizes[0][:5] == [14] * 5 and sizes[2][5:9] == [17] * 4 and sizes[1][9:] == [22] * 3
    assert got["comm"] == [], "FSDP2 has no DDP comm mode"
    # shard-recompute: rank 1 alone recomputes in backward, inside the unit it gathered.
    assert got["recompute"] == ((False, True, False) if mode == "shard-recompute" else (False,) * 3)
    ref = worker.single_process_reference(mode, 12, 24)
    assert set(got["params"]) == set(ref)
    for name, value in ref.items():
        scale = max(value.abs().max().item(), 1.0)
        diff = (got["params"][name] - value).abs().max().item()
        assert diff <= 1e-5 * scale, f"{name}: max abs diff {diff:.3g}"


def test_sharded_compute_only_time_finds_a_rank_slowed_inside_backward(run_ranks, tmp_path: Path):
    """Gloo blocks the host in FSDP2's gathers and reduce-scatters: their time is moved
    from compute to communication, so the fast rank's wait for the slow one is not
    mistaken for compute."""
    prefix = tmp_path / "timing"
    run_ranks("timing.py", 2, str(prefix), "shard")
    fast, slow = (torch.load(f"{prefix}.rank{r}")[r] for r in range(2))
    assert slow["compute_s"] - fast["compute_s"] > 0.035, (fast, slow)
    assert fast["compute_s"] < 0.5 * slow["compute_s"], (fast, slow)
    assert fast["comm_s"] > 0.03, (fast, slow)


TINY = ["--model", "debug", "--num-samples", "960", "--global-batch", "48", "--quiet"]
SHARDED = [*TINY, "--shard", "full", "--rebalance-interval", "4", "--ideal-steps", "0"]
SHARDED += ["--eval-samples", "0", "--checkpoint-interval", "4"]


@pytest.fixture(scope="module")
def stopped_at_step_4(hetero_train, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded run of 3 ranks stopped at step 4; each test resumes a copy of it."""
    out = tmp_path_factory.mktemp("sharded") / "run"
    run = hetero_train(*SHARDED, "--nproc", "3", "--steps", "4", "--output-dir", str(out))
    assert run.returncode == 0, run.stderr
    return out


@pytest.mark.timeout(900)  # three runs of FSDP2 on Gloo: minutes on a loaded 2-core host
def test_a_sharded_checkpoint_resumes_on_fewer_ranks_with_the_uninterrupted_losses(
    hetero_train, tmp_path: Path, stopped_at_step_4: Path
):
    """Shards written by every rank with torch.distributed.checkpoint, resharded on load:
    3 ranks stop at step 4, 2 ranks go on to 12 with the losses of 3 ranks that never
    stopped (global sample order, same global batch, exact gradients)."""
    full, part = tmp_path / "full", tmp_path / "part"
    a = hetero_train(*SHARDED, "--nproc", "3", "--steps", "12", "--output-dir", str(full))
    assert a.returncode == 0, a.stderr
    shutil.copytree(stopped_at_step_4, part)
    ckpt = part / "checkpoints" / "last.pt"
    state = read_checkpoint(ckpt)
    assert state["model"] is None and state["shards"] == "last.pt.step4.shards"
    c = hetero_train(
        *SHARDED, "--nproc", "2", "--steps", "12", "--output-dir", str(part), "--resume", "auto"
    )
    assert c.returncode == 0, c.stderr
    ref = {r["step"]: r["loss"] for r in read_metrics(full / "metrics" / "rank0.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(part / "metrics" / "rank0.jsonl")}
    for step in (8, 12):
        assert got[step] == pytest.approx(ref[step], rel=1e-4), step
    # Only the newest step's shards are kept.
    assert sorted(p.name for p in ckpt.parent.glob("*.shards")) == ["last.pt.step12.shards"]


@pytest.mark.timeout(900)
def test_sharded_checkpoints_refuse_planted_metadata_and_unsharded_state(
    hetero_train, tmp_path: Path, stopped_at_step_4: Path
):
    out = tmp_path / "run"
    shutil.copytree(stopped_at_step_4, out)
    shards = out / "checkpoints" / "last.pt.step4.shards"
    marker = tmp_path / "ran"
    # DCP's own reader unpickles .metadata with plain pickle: a planted one runs code there.
    (shards / ".metadata").write_bytes(pickle.dumps(_Planted(str(marker))))
    again = hetero_train(
        *SHARDED, "--nproc", "2", "--steps", "8", "--output-dir", str(out), "--resume", "auto"
    )
    assert again.returncode != 0 and not marker.exists()
    assert "refusing checkpoint shards" in again.stderr and "Traceback" not in again.stderr
    plain = tmp_path / "plain"
    run = [*TINY, "--nproc", "2", "--ideal-steps", "0", "--checkpoint-interval", "4"]
    assert hetero_train(*run, "--steps", "4", "--output-dir", str(plain)).returncode == 0
    sharded = hetero_train(
        *run, "--steps", "8", "--shard", "full", "--output-dir", str(plain), "--resume", "auto"
    )
    assert sharded.returncode != 0 and "was written without shard" in sharded.stderr


class _Planted:
    """Pickles as a call of ``os.system`` (what an attacker would plant)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)
