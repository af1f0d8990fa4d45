"""Pipeline replicas under uneven data parallelism: which rank holds which stage, what
devices a split is cut for, the microbatch a step is cut into, and whether re-cutting
the stages pays for itself.

**The layout.** ``W`` ranks and pipelines of ``S`` stages make ``R = W / S`` replicas.
Replica ``k`` is ranks ``k·S … k·S + S − 1``, stage ``s`` of it rank ``k·S + s``: a
launcher numbers a node's ranks together, so a replica's stages share a node where they
can and the activations, sent every microbatch, cross the fastest link; the gradient
all-reduce between the replicas of a stage crosses nodes once a step, as plain DDP's does.

**One split for every replica.** The replicas of a stage hold the same blocks, so that
their gradients can be summed. The devices a split is cut for are therefore each stage's
across the replicas: its speed the harmonic mean of theirs (a split that balances these
balances the sum of the replicas' stage times), its memory the least of theirs (the split
must fit every replica). What differs between replicas after that is their pace, and the
data-parallel planner, one level up, evens it out: replica ``k`` gets ``m_k`` microbatches
of the global batch, in proportion to its measured speed (its slowest stage's, which its
step time shows).

**The microbatch.** Every microbatch of a step has the same ``μ`` samples (the stages'
buffers are sized once per shape), so a replica's share is ``m_k · μ`` and the planner
plans in microbatches: ``B / μ`` of them a step. :func:`microbatch_for` takes the largest
``μ`` at most the one wanted that divides the global batch and leaves every replica one.

**Re-cutting.** A split cut for the speeds measured at the start goes stale when a device
slows down (a neighbour starts on its GPU). :func:`recut` reads each stage's speed back
from its measured seconds (:func:`hetero.core.stages.measured_speeds`), re-cuts for them,
and adopts the new split only if it pays for itself, by the rule plan changes follow
(``hetero.core.balancer.payback``): the gain a step beyond the dead band, over the steps
the new split will run, exceeds what moving the stages costs.

Pure: no torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.payback import Horizon
from hetero.core.errors import ConfigError
from hetero.core.stages import (
    Device,
    Model,
    Partition,
    Pipeline,
    measured_speeds,
    partition,
    stage_cost,
    step_seconds,
)


@dataclass(frozen=True)
class Layout:
    """``world_size`` ranks as replicas of a pipeline of ``stages`` stages (module doc)."""

    stages: int
    world_size: int

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ConfigError(f"pipeline: needs at least 1 stage, got {self.stages}")
        if self.world_size % self.stages:
            raise ConfigError(
                f"pipeline: {self.stages} stages do not divide {self.world_size} ranks "
                f"(each replica needs all {self.stages}); use a multiple of {self.stages} ranks"
            )

    @property
    def replicas(self) -> int:
        return self.world_size // self.stages

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def replica_ranks(self, replica: int) -> tuple[int, ...]:
        """The ranks of ``replica``, stage by stage."""
        return tuple(range(replica * self.stages, (replica + 1) * self.stages))

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        """The ranks holding ``stage``, replica by replica (its gradient's group)."""
        return tuple(range(stage, self.world_size, self.stages))


def stage_devices(
    speeds: Sequence[float], capacities: Sequence[float], layout: Layout
) -> tuple[Device, ...]:
    """The devices a split is cut for, one a stage, from each rank's ``speeds`` (over the
    profiling device's) and ``capacities`` (bytes): across the stage's replicas, the
    harmonic mean speed and the least memory (module doc)."""
    if len(speeds) != layout.world_size or len(capacities) != layout.world_size:
        raise ValueError(f"{len(speeds)} speeds for {layout.world_size} ranks")
    out = []
    for s in range(layout.stages):
        ranks = layout.stage_ranks(s)
        speed = len(ranks) / math.fsum(1.0 / speeds[r] for r in ranks)
        out.append(Device(speed, min(capacities[r] for r in ranks)))
    return tuple(out)


def microbatch_for(global_batch: int, replicas: int, wanted: int) -> int:
    """The samples a microbatch: the largest divisor of ``global_batch`` at most ``wanted``
    that leaves each of ``replicas`` at least one microbatch; a ``ConfigError`` when the
    global batch has fewer samples than there are replicas."""
    if global_batch < replicas:
        raise ConfigError(
            f"global batch {global_batch} is smaller than {replicas} pipeline replicas: "
            f"give at least {replicas}"
        )
    for mu in range(min(wanted, global_batch // replicas), 0, -1):
        if global_batch % mu == 0:
            return mu
    return 1


@dataclass(frozen=True)
class Recut:
    """:func:`recut`'s answer: the split to move to (``None``: keep the current one), the
    predicted seconds a step of the current and of the proposed split, the cost of the
    move (s), and why, in words."""

    partition: Partition | None
    now_s: float
    new_s: float
    cost_s: float
    reason: str


def recut(
    model: Model,
    bounds: Sequence[int],
    stage_seconds: Sequence[float],
    capacities: Sequence[float],
    pipe: Pipeline,
    *,
    horizon: Horizon,
    move_s: float,
    payback_intervals: int = 10,
    dead_band: float = 0.02,
) -> Recut:
    """Whether to move from the split ``bounds`` whose stages measured ``stage_seconds``
    a microbatch (their own compute) to the split those speeds call for (module doc).

    ``capacities``: each stage's device memory (bytes); ``move_s``: seconds the move
    costs the job (saving and loading the stages' state, rebuilding the schedule);
    ``horizon``: how long a split adopted now runs, as ``Horizon.steps(payback_intervals)``
    counts it; ``dead_band``: the least relative gain that counts (the measured times'
    noise: the balancer's default is 1%, stage times measured over fewer steps get 2%).
    The gain is ``now − new`` in predicted step seconds (bubble included, transfers
    left out); the move is made when ``(gain/now − dead_band) · now · steps > move_s``."""
    speeds = measured_speeds(model, bounds, stage_seconds)
    devices = [Device(v, c) for v, c in zip(speeds, capacities, strict=True)]
    stages = len(devices)
    current = [
        stage_cost(model, devices, pipe, j, bounds[j], bounds[j + 1])[0] for j in range(stages)
    ]
    now = step_seconds(current, pipe.microbatches)
    best = partition(model, devices, pipe)
    new = step_seconds(best.stage_seconds, pipe.microbatches)
    if tuple(best.bounds) == tuple(bounds) or new >= now:
        return Recut(None, now, now, 0.0, "the split is the best one for the measured speeds")
    gain = (now - new) / now
    steps = horizon.steps(payback_intervals)
    net = (gain - dead_band) * now * steps - move_s
    text = (
        f"blocks {_sizes(bounds)} -> {best.sizes}: {gain:.1%} a step "
        f"({now * 1e3:.1f} -> {new * 1e3:.1f} ms) over {steps} steps against a "
        f"{move_s:.1f} s move"
    )
    if gain <= dead_band:
        return Recut(None, now, new, move_s, f"{text}: within the {dead_band:.0%} dead band")
    if net <= 0:
        return Recut(None, now, new, move_s, f"{text}: does not pay for itself")
    return Recut(best, now, new, move_s, f"{text}: pays for itself")


def _sizes(bounds: Sequence[int]) -> tuple[int, ...]:
    return tuple(b - a for a, b in itertools.pairwise(bounds))
