"""Re-cutting a pipeline's stages at a checkpoint, when its devices' speeds drifted and the
move pays for itself.

The split a pipeline started with was cut for the speeds measured then. At a checkpoint
boundary, :func:`recut_if_it_pays` reads each stage's speed back from the compute its
clock measured since the last boundary (the mean over the stage's replicas of its seconds
a microbatch), and rank 0 asks :func:`hetero.core.pipeplan.recut` whether another split
gains enough a step, over the steps it would run, to pay for the move. A move is made the
way a resumed run makes it: a fresh copy of the model cut at the new bounds, a fresh
optimizer over its stage, and the checkpoint just written (every rank's stage, keyed by
the whole model's names, ``torch.distributed.checkpoint``) loaded into both, so nothing is
lost or changed but where the blocks run.

**The move's cost** is taken as twice the checkpoint's write (its read, about as long, and
the write itself, which a move needs even where the job checkpoints anyway), the same on
every rank: what the payback rule weighs the gain against. **The horizon** is the steps
until the next checkpoint boundary's chance to cut again, ``payback_intervals`` of them
as plan changes count it, fewer where the job ends sooner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hetero.core.balancer import Horizon
from hetero.core.catalogue import TrainingOptions
from hetero.core.pipeplan import Recut, recut, stage_devices
from hetero.core.stages import Pipeline
from hetero.trainer.pipeline.wrap import PipelineModel
from hetero.trainer.pipeline.wrap import recut as cut_again
from hetero.trainer.shardstate import load_shards, shards_dir

if TYPE_CHECKING:
    from hetero.trainer.context import Context


@dataclass(frozen=True)
class Move:
    """A re-cut as the ranks made it: at ``step``, from ``before`` to ``after`` bounds."""

    step: int
    before: tuple[int, ...]
    after: tuple[int, ...]
    reason: str


def stage_seconds(ctx: Context) -> list[float] | None:
    """Collective: each stage's seconds a microbatch since the last call (the mean over its
    replicas of their own compute); None where a stage timed none."""
    assert ctx.pipeline is not None and ctx.layout is not None
    seconds, _, passes = ctx.pipeline.pipe.clock.take()
    every: list[Any] = [[seconds, passes]]
    if ctx.world_size > 1:
        every = [None] * ctx.world_size
        dist.all_gather_object(every, [seconds, passes])
    out = []
    for j in range(ctx.layout.stages):
        timed = [every[r][0] / every[r][1] for r in ctx.layout.stage_ranks(j) if every[r][1]]
        if not timed:
            return None
        out.append(sum(timed) / len(timed))
    return out


def decide(ctx: Context, *, horizon: Horizon, move_s: float) -> Recut | None:
    """Collective: rank 0's answer, on every rank (None: nothing measured to decide on)."""
    assert ctx.pipeline is not None and ctx.layout is not None
    measured = stage_seconds(ctx)
    answer: list[Recut | None] = [None]
    if ctx.rank == 0 and measured is not None:
        split, pipe = ctx.pipeline.split, ctx.pipeline.pipe
        devices = stage_devices(split.speeds, split.capacities, ctx.layout)
        share = max(ctx.running_plan) // pipe.microbatch  # the slowest replica's, at most
        answer = [
            recut(
                split.model,
                pipe.bounds,
                measured,
                [d.capacity_bytes for d in devices],
                Pipeline(max(share, 1), pipe.microbatch, pipe.schedule),
                horizon=horizon,
                move_s=move_s,
            )
        ]
    if ctx.world_size > 1:
        dist.broadcast_object_list(answer, src=0)
    return answer[0]


def recut_if_it_pays(
    ctx: Context,
    shards: Path,
    make_model: Callable[[], nn.Module],
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    *,
    horizon: Horizon,
    move_s: float,
) -> tuple[PipelineModel, torch.optim.Optimizer, Move] | None:
    """Collective, right after a checkpoint whose stages are in ``shards``: the re-cut
    model and its optimizer, loaded from them, if a re-cut pays (module doc); else None.
    ``make_model()``: a fresh copy of the whole model; ``make_optimizer(model)``: the
    optimizer over a wrapped model's parameters."""
    assert ctx.pipeline is not None
    answer = decide(ctx, horizon=horizon, move_s=move_s)
    if answer is None or answer.partition is None:
        return None
    before = ctx.pipeline.pipe.bounds
    model = cut_again(ctx, make_model(), answer.partition.bounds)
    optimizer = make_optimizer(model)
    load_shards(shards, model, optimizer, by_name=True)
    ctx.clock.restart()
    return model, optimizer, Move(ctx.global_step, before, answer.partition.bounds, answer.reason)


def at_checkpoint(
    ctx: Context,
    cfg: TrainingOptions,
    make_model: Callable[[], nn.Module],
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    *,
    total_steps: int,
    checkpoint_s: float,
) -> tuple[PipelineModel, torch.optim.Optimizer, Move] | None:
    """A built-in job's re-cut, right after its periodic checkpoint (``cfg``'s directory and
    interval): :func:`recut_if_it_pays` with the move's cost twice the checkpoint's write
    (``checkpoint_s``) and the horizon its next checkpoint intervals (module doc); rank 0
    says what moved."""
    path, every = cfg.checkpoint_file, cfg.checkpoint_every
    assert path is not None and every
    moved = recut_if_it_pays(
        ctx,
        shards_dir(Path(path), ctx.global_step),
        make_model,
        make_optimizer,
        horizon=Horizon(every, total_steps - ctx.global_step),
        move_s=2.0 * checkpoint_s,
    )
    if moved is not None and ctx.rank == 0 and not cfg.quiet:
        print(f"step {moved[2].step}: pipeline re-cut, {moved[2].reason}", flush=True)
    return moved
