"""Real torch.distributed processes on Gloo: exact gradients, compute-only timing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from hetero.trainer.datasets import SyntheticImages
from hetero.trainer.sampler import epoch_permutation

_spec = importlib.util.spec_from_file_location(
    "equivalence_worker", Path(__file__).parent / "workers" / "equivalence.py"
)
assert _spec and _spec.loader
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

pytestmark = pytest.mark.slow


def _single_process_reference(mode: str, steps: int, global_batch: int) -> dict[str, torch.Tensor]:
    """The same training as one process over the whole global batch: what DDP must equal."""
    model = worker.build(mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    data = SyntheticImages(240, 8, 10, seed=1)
    loss_fn = nn.CrossEntropyLoss()
    per_epoch = len(data) // global_batch
    for step in range(steps):
        epoch, k = divmod(step, per_epoch)
        idx = epoch_permutation(len(data), 5, epoch)[k * global_batch : (k + 1) * global_batch]
        x, y = data.get_batch(idx, torch.device("cpu"))
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "mode",
    [
        "scripted",
        "dynamic",
        "workers",
        "plainbackward",
        pytest.param(
            "syncbn",
            marks=pytest.mark.skipif(
                torch.cuda.device_count() < 3, reason="SyncBatchNorm runs on CUDA ranks only"
            ),
        ),
    ],
)
def test_uneven_ddp_equals_single_process_over_the_global_batch(run_ranks, tmp_path: Path, mode):
    out = tmp_path / "params.pt"
    run_ranks("equivalence.py", 3, str(out), mode)
    got = torch.load(out)
    sizes = [torch.load(f"{out}.rank{r}.sizes") for r in range(3)]
    # Every step's batches summed to the global batch, and were really uneven.
    assert all(sum(s) == 24 for s in zip(*sizes, strict=True))
    assert any(len(set(s)) > 1 for s in zip(*sizes, strict=True))
    if mode not in ("dynamic", "workers"):
        assert sizes[0][:5] == [14] * 5 and sizes[2][5:9] == [17] * 4 and sizes[1][9:] == [22] * 3
    else:
        # The emulated 4x-slow rank 2 was given less than an equal share at the end.
        assert got["plans"][-1][2] < 8, got["plans"]
    ref = _single_process_reference(mode, 12, 24)
    for name, value in ref.items():
        if name.endswith("num_batches_tracked"):
            continue
        scale = max(value.abs().max().item(), 1.0)
        diff = (got["params"][name] - value).abs().max().item()
        assert diff <= 1e-5 * scale, f"{name}: max abs diff {diff:.3g}"


def test_compute_only_time_finds_a_rank_slowed_inside_backward(run_ranks, tmp_path: Path):
    prefix = tmp_path / "timing"
    run_ranks("timing.py", 2, str(prefix))
    fast, slow = (torch.load(f"{prefix}.rank{r}")[r] for r in range(2))
    # Wall time per step is the same on both ranks: the all-reduce waits for the slow one...
    assert abs(fast["step_s"] - slow["step_s"]) < 0.25 * slow["step_s"], (fast, slow)
    assert fast["step_s"] > 0.045
    # ...but compute-only time tells them apart by about the 50 ms injected in backward.
    assert slow["compute_s"] - fast["compute_s"] > 0.035, (fast, slow)
    assert fast["compute_s"] < 0.5 * slow["compute_s"]
    # The fast rank spends the difference waiting for communication.
    assert fast["comm_s"] > 0.03
