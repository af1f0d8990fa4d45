"""Exactness with BatchNorm on CUDA ranks, uneven and changing batches (2 NCCL ranks):
SyncBatchNorm matches one process over the global batch; per-rank BatchNorm does not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

_spec = importlib.util.spec_from_file_location(
    "equivalence_worker", Path(__file__).parents[1] / "integration" / "workers" / "equivalence.py"
)
assert _spec and _spec.loader
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def _worst_relative_diff(mode: str, out: Path) -> float:
    got = torch.load(out, map_location="cpu")
    ref = worker.single_process_reference(mode, worker.STEPS, worker.GLOBAL_BATCH, "cuda:0")
    return max(
        (got["params"][k] - v).abs().max().item() / max(v.abs().max().item(), 1.0)
        for k, v in ref.items()
        if not k.endswith("num_batches_tracked")
    )


def test_syncbatchnorm_on_cuda_ranks_with_uneven_batches_equals_one_process(
    run_ranks, tmp_path: Path
) -> None:
    out = tmp_path / "params.pt"
    run_ranks("equivalence.py", 2, str(out), "syncbn")
    sizes = [torch.load(f"{out}.rank{r}.sizes") for r in range(2)]
    assert sizes[0][:5] == [17] * 5 and sizes[1][5:9] == [19] * 4 and sizes[0][9:] == [22] * 3
    # fp32 on both sides (TF32 off); NCCL's sum order differs from one process's.
    worst = _worst_relative_diff("syncbn", out)
    assert worst <= 1e-4, f"SyncBatchNorm differs from one process by {worst:.2g}"


def test_per_rank_batchnorm_on_cuda_ranks_is_not_exact(run_ranks, tmp_path: Path) -> None:
    out = tmp_path / "params.pt"
    run_ranks("equivalence.py", 2, str(out), "bn")
    worst = _worst_relative_diff("bn", out)
    assert worst > 1e-3, f"per-rank BatchNorm came within {worst:.2g} of one process"
