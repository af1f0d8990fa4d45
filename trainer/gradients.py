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

**When the all-reduces start** (``WeightingState.mode``):

- ``overlap`` (DDP's own schedule): each bucket's all-reduce starts as soon as
  DDP hands the bucket over, during the rest of backward. It hides
  communication behind compute, but on a rank that finishes first its
  collective kernels start early and wait there for the slower ranks' buckets,
  holding GPU resources its backward still needs: its measured compute grows
  into its slack (on 2x H100 with a neighbour on one GPU, ViT-B/16's fast rank
  went from 69 to 79 ms), and the planner cannot see that slack.
- ``deferred``: every bucket is held until DDP hands over the step's last one,
  then all are launched in bucket order. Compute is clean; the whole all-reduce
  is exposed after it (about 3-4 ms for ~350 MB of fp32 gradients over NVLink).

Both modes add the same buffers in the same order, so the gradients are the
same. DDP hands buckets over in index order (its reducer launches bucket ``k``
only after ``k-1``), so the bucket with ``is_last()`` really is the last one of
the step. The mode is read per bucket; it changes only between steps.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

OVERLAP = "overlap"
DEFERRED = "deferred"
MODES = (OVERLAP, DEFERRED)


@dataclass
class WeightingState:
    """Mutable state the hook reads each step; the trainer sets ``scale`` per step and
    ``mode`` between steps."""

    scale: float = 1.0
    process_group: dist.ProcessGroup | None = None
    on_grads_ready: Callable[[], None] = field(default=lambda: None)
    mode: str = OVERLAP
    #: Buckets of the step in progress held back in ``deferred`` mode, with the future
    #: DDP got for each, in bucket order.
    held: list[tuple[torch.Tensor, torch.futures.Future[torch.Tensor]]] = field(
        default_factory=list
    )


def weighted_allreduce_hook(
    state: WeightingState,
    bucket: dist.GradBucket,  # type: ignore[name-defined]
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: scale by ``b_i/B`` and all-reduce with SUM, now or at the last bucket."""
    last = bucket.is_last()
    if bucket.index() == 0:
        # Left over from an iteration DDP abandoned (it errors on its own then): the
        # futures are no longer awaited, and launching them would desynchronize ranks.
        state.held.clear()
    if last:
        state.on_grads_ready()
    buf = bucket.buffer()
    buf.mul_(state.scale)
    if state.mode == DEFERRED and not last:
        # CUDA: a future that knows the device records an event when it is set and makes
        # DDP's stream wait for it; a CPU future (Gloo on CPU) just completes.
        held: torch.futures.Future[torch.Tensor] = torch.futures.Future(
            devices=[buf.device] if buf.is_cuda else None
        )
        state.held.append((buf, held))
        return held
    pending, state.held = state.held, []
    for earlier, target in pending:
        _allreduce(state, earlier).then(functools.partial(_complete, target))
    return _allreduce(state, buf)


def _allreduce(state: WeightingState, buf: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=state.process_group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


def _complete(
    target: torch.futures.Future[torch.Tensor], done: torch.futures.Future[torch.Tensor]
) -> None:
    """Hand a finished all-reduce to the future DDP holds for its bucket.

    Runs as a ``then`` callback: on CUDA the current streams there already wait
    for the collective, so ``set_result`` records its event after the reduction.
    A failed collective fails DDP's future too, instead of leaving it waiting.
    """
    try:
        value = done.value()
    except Exception as exc:
        target.set_exception(exc)  # type: ignore[arg-type]  # torch's stub says T, not an error
        raise
    target.set_result(value)
