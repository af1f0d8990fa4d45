"""Exact gradients for uneven per-rank batches under DistributedDataParallel.

Each rank's loss is the mean over its own ``b_i`` samples, so its gradient is
``(1/b_i) Σ_local g``. Plain DDP divides every rank's gradient by ``W`` and sums,
which is the global mean only when all ``b_i`` are equal. This comm hook instead
scales rank ``i``'s bucket by ``b_i / B`` before an all-reduce *sum*:

    Σ_i (b_i / B) · (1/b_i) Σ_{local} g  =  (1/B) Σ_{all B samples} g

which is exactly the gradient of the mean loss over the global batch, for any
plan. With ``b_i = B/W`` the scale is ``1/W``, the same as plain DDP.

``Context.backward`` scales the loss by ``b_i/B`` instead and sets the hook's
scale to 1: the same sum for ordinary layers, and still exact for layers that
mix ranks in backward (SyncBatchNorm all-reduces gradient statistics, so a
rank's gradient then carries terms of every rank's loss, and those must
already be weighted).

The hook also marks ``grads_ready`` on the step clock when DDP hands it the
last bucket (every gradient has been computed by then) and applies an emulated
slowdown there, so a slow rank delays the all-reduce as a slow device would.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class WeightingState:
    """Mutable state the hook reads each step; the trainer sets ``scale`` per step."""

    scale: float = 1.0
    process_group: dist.ProcessGroup | None = None
    on_grads_ready: Callable[[], None] = field(default=lambda: None)


def weighted_allreduce_hook(
    state: WeightingState,
    bucket: dist.GradBucket,  # type: ignore[name-defined]
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: scale by ``b_i/B`` and all-reduce with SUM."""
    if bucket.is_last():
        state.on_grads_ready()
    buf = bucket.buffer()
    buf.mul_(state.scale)
    work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=state.process_group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])
