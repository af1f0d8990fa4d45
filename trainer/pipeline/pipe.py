"""A rank's stage at work: its ``torch.distributed.pipelining`` schedule, the replica it
belongs to, and the gradient that comes out exact.

**Groups.** With ``W`` ranks and ``S`` stages (``hetero.core.pipeplan.Layout``) a rank
talks over three kinds of group: its replica's ranks (the schedule's sends and receives
of activations and their gradients), its stage's ranks across the replicas (the sum of
the stage's gradients, as data parallelism's all-reduce), and, within its replica, the
stages that hold a copy of a tied weight (GPT-2's and BERT's output layer shares the
token embedding: the first and the last stage each hold it). Every rank makes every
group, in one order (``new_group`` is collective over the world).

**Exactness.** A replica's share of the global batch of ``B`` samples is ``m`` microbatches
of ``μ`` samples. Each microbatch's loss, its mean, is weighted ``μ / B`` before backward
(the schedule's own division by ``m`` is off: ``scale_grads=False``), so a stage's
gradient after its schedule is its share of the gradient of the global mean loss; the sum
over the stage's replicas is then the whole of it, and the sum over a tied weight's
copies gives each copy the gradient of the one weight, so the copies take one update and
stay equal (Megatron-LM's treatment of tied embeddings). This is the weighting of the
data-parallel path (``hetero.trainer.gradients``: each rank's mean loss times ``b_i/B``,
summed), with a microbatch in the place of a rank's batch; like it, it takes every sample
to weigh alike in the loss (a token mean over samples of one length). One replica and
``B`` its own batch: the mean over its microbatches, one process's gradient.

**Shapes.** A ``PipelineStage`` sizes its receive buffers at its first step, so a
schedule is made, and kept, for each number of microbatches a replica is given (a plan
change gives it another); ``μ`` never changes within a run. torch's 1F1B needs at least a
microbatch a stage: a replica given fewer runs them under GPipe, whose bubble is the same
and which then holds no more activations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from hetero.core.errors import ConfigError
from hetero.core.pipeplan import Layout
from hetero.core.stages import Schedule
from hetero.trainer.models.repeated import LOOKED_FOR, repeated_blocks
from hetero.trainer.pipeline.stage import (
    Cut,
    Loss,
    StageClock,
    cut_builtin,
    is_builtin,
    lm_loss,
    traced_stage,
)

#: Elements a gradient all-reduce carries at once (DDP's 25 MiB buckets, in fp32).
BUCKET_ELEMENTS = 25 * 2**20 // 4


def _member(group: object) -> dist.ProcessGroup | None:
    """``new_group``'s answer as a group, or None on a rank outside it (a marker)."""
    return group if isinstance(group, dist.ProcessGroup) else None


@dataclass(frozen=True)
class Groups:
    """This rank's groups (module doc): ``replica`` (None: the default group is the one
    replica), ``grads`` (None: one replica, nothing to sum), ``tied`` (per tuple of stages
    holding tied weights, this replica's group of them, if this rank is among them)."""

    replica: dist.ProcessGroup | None
    grads: dist.ProcessGroup | None
    tied: dict[tuple[int, ...], dist.ProcessGroup]


def make_groups(layout: Layout, rank: int, tie_sets: Iterable[tuple[int, ...]]) -> Groups:
    """Every group of ``layout`` (collective: every rank calls it with the same ``tie_sets``),
    and those of them ``rank`` is in."""
    replica: dist.ProcessGroup | None = None
    grads: dist.ProcessGroup | None = None
    if layout.replicas > 1:
        for k in range(layout.replicas):
            made = _member(dist.new_group(list(layout.replica_ranks(k))))
            replica = made if layout.replica_of(rank) == k else replica
        for s in range(layout.stages):
            made = _member(dist.new_group(list(layout.stage_ranks(s))))
            grads = made if layout.stage_of(rank) == s else grads
    tied: dict[tuple[int, ...], dist.ProcessGroup] = {}
    for stages in sorted(set(tie_sets)):
        for k in range(layout.replicas):
            ranks = [layout.replica_ranks(k)[j] for j in stages]
            made = _member(dist.new_group(ranks))
            if made is not None and rank in ranks:
                tied[stages] = made
    return Groups(replica, grads, tied)


@dataclass
class Pipe:
    """One rank's stage (``module``, timed by ``clock``) and the schedules that run it.

    ``bounds``: the split (stage ``i`` holds blocks ``bounds[i]:bounds[i + 1]``);
    ``microbatch``: samples a microbatch; ``ties``: each tied parameter this stage holds
    (its name in ``module``) and the stages holding a copy."""

    module: nn.Module
    clock: StageClock
    layout: Layout
    rank: int
    bounds: tuple[int, ...]
    microbatch: int
    groups: Groups
    ties: dict[str, tuple[int, ...]]
    device: torch.device
    schedule: Schedule = Schedule.ONE_F_ONE_B
    loss: Loss | None = None
    _schedules: dict[int, ScheduleGPipe | Schedule1F1B] = field(default_factory=dict)
    _weight: float = 1.0

    @property
    def index(self) -> int:
        """This rank's stage."""
        return self.layout.stage_of(self.rank)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.layout.stages - 1

    def _weighted_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self.loss is not None
        return self.loss(output, target) * self._weight

    def _schedule_for(self, microbatches: int) -> ScheduleGPipe | Schedule1F1B:
        if microbatches not in self._schedules:
            stage = PipelineStage(
                self.module, self.index, self.layout.stages, self.device, group=self.groups.replica
            )
            # torch's 1F1B wants a microbatch a stage at least; with fewer, GPipe has the
            # same bubble and holds no more (every microbatch, fewer than the stages).
            gpipe = self.schedule is Schedule.GPIPE or microbatches < self.layout.stages
            kind = ScheduleGPipe if gpipe else Schedule1F1B
            self._schedules[microbatches] = kind(
                stage, microbatches, loss_fn=self._weighted_loss, scale_grads=False
            )
        return self._schedules[microbatches]

    def step(
        self, x: torch.Tensor, target: torch.Tensor, global_batch: int | None = None
    ) -> torch.Tensor | None:
        """:meth:`forward_backward`, then :meth:`sum_replicas`: the gradients are then one
        process's over the global batch; the caller steps its optimizer."""
        loss = self.forward_backward(x, target, global_batch)
        self.sum_replicas()
        return loss

    def forward_backward(
        self, x: torch.Tensor, target: torch.Tensor, global_batch: int | None = None
    ) -> torch.Tensor | None:
        """Forward and backward of this replica's share, ``x`` and ``target`` (every rank of
        the replica passes the same; each uses what its stage needs), as part of a step of
        ``global_batch`` samples (default: this share alone), the tied copies' gradients
        summed (module doc). The share's mean loss (detached) on the last stage, None on
        the others."""
        samples = int(x.shape[0])
        if samples % self.microbatch:
            raise ValueError(f"a share of {samples} samples is no multiple of {self.microbatch}")
        self._weight = self.microbatch / (global_batch or samples)
        schedule = self._schedule_for(samples // self.microbatch)
        losses: list[torch.Tensor] = []
        if self.first and self.last:
            schedule.step(x, target=target, losses=losses)
        elif self.first:
            schedule.step(x)
        elif self.last:
            schedule.step(target=target, losses=losses)
        else:
            schedule.step()
        self._sum_tied()
        if not losses:
            return None
        return torch.stack([loss.detach() for loss in losses]).mean() / self._weight

    def _sum_tied(self) -> None:
        params = dict(self.module.named_parameters())
        for name, stages in sorted(self.ties.items()):
            p = params[name]
            if p.grad is None:  # a copy no sample reached: zero, so every copy steps alike
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.groups.tied[stages])

    def sum_replicas(self) -> None:
        """The stage's gradients summed over its replicas, in buckets (the data-parallel
        all-reduce; nothing with one replica)."""
        if self.groups.grads is None:
            return
        grads = []
        for p in self.module.parameters():
            if p.grad is None:  # no sample reached it: its share is zero, not absent
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        _sum_in_buckets(grads, self.groups.grads)


def _sum_in_buckets(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """All-reduce ``grads`` in place, a flat bucket of at most ``BUCKET_ELEMENTS`` (one
    dtype) at a time: one collective a bucket, not one a tensor."""
    bucket: list[torch.Tensor] = []

    def flush() -> None:
        if not bucket:
            return
        flat = torch.cat([b.reshape(-1) for b in bucket])
        dist.all_reduce(flat, group=group)
        offset = 0
        for b in bucket:
            b.copy_(flat[offset : offset + b.numel()].view_as(b))
            offset += b.numel()
        bucket.clear()

    size = 0
    for g in grads:
        if bucket and (size + g.numel() > BUCKET_ELEMENTS or g.dtype != bucket[0].dtype):
            flush()
            size = 0
        bucket.append(g)
        size += g.numel()
    flush()


def cut(model: nn.Module, bounds: Sequence[int], stage: int, example: torch.Tensor | None) -> Cut:
    """Stage ``stage`` of ``model`` split at ``bounds``: a built-in model cut by its parts,
    any other at its repeated blocks by the tracer (``example``: a microbatch of input)."""
    if is_builtin(model):
        return cut_builtin(model, bounds, stage)  # type: ignore[arg-type]
    if example is None:
        raise ConfigError(
            f"a pipeline of {type(model).__name__} needs an example microbatch of its input "
            "(ctx.wrap(..., example=x)) to trace it"
        )
    return traced_stage(model, block_names(model), bounds, stage, example)


def block_names(model: nn.Module) -> list[str]:
    """The names of the blocks ``model`` is cut between (``trainer.models.repeated``)."""
    names = [n for n, _ in repeated_blocks(model)]
    if not names:
        raise ConfigError(
            f"{type(model).__name__} has no {LOOKED_FOR}: there is nothing to cut into "
            "pipeline stages"
        )
    return names


def build(
    model: nn.Module,
    bounds: Sequence[int],
    microbatch: int,
    *,
    layout: Layout | None = None,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    loss: Loss = lm_loss,
    device: torch.device | None = None,
    example: torch.Tensor | None = None,
    groups: Groups | None = None,
) -> Pipe:
    """This rank's stage of ``model`` split at ``bounds`` (from
    :func:`hetero.core.stages.partition`), in ``layout`` (default: one replica of the
    whole group, a stage a rank), run in microbatches of ``microbatch`` samples under
    ``schedule`` with ``loss`` on the last stage. Every rank calls it (its groups are
    made collectively, unless ``groups``, those of an earlier split of the model, are
    given); a built-in ``model`` is cut in place."""
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = layout or Layout(world, world)
    if len(bounds) != layout.stages + 1:
        raise ValueError(f"{len(bounds) - 1} stages' bounds for a pipeline of {layout.stages}")
    device = device or torch.device("cpu")
    part = cut(model, bounds, layout.stage_of(rank), example)
    groups = groups or make_groups(layout, rank, part.tie_sets)
    module = part.module.to(device)
    clock = StageClock(device)
    clock.attach(module)
    return Pipe(
        module,
        clock,
        layout,
        rank,
        tuple(bounds),
        microbatch,
        groups,
        dict(part.ties),
        device,
        schedule,
        loss,
    )
