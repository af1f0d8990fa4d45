"""Pipeline stages sized to unlike devices: a model's blocks, cut into contiguous stages so
that the slowest stage, on its own device, is as fast as any split allows.

**The cost model.** A model is a *head* (what runs before the first repeated block:
embeddings), its repeated *blocks* in order, and a *tail* (what runs after: the final
norm, the output layer, the loss). Each part's :class:`PartCost` is measured once, on one
device, at the microbatch size: forward plus backward seconds, the training state its
parameters hold (bytes), and the activations one sample keeps for backward (bytes). A
device's ``speed`` is its rate over the profiling device's (2.0: twice as fast), so a
stage's time per microbatch is the sum of its parts' times over its device's speed.

A stage's peak memory is :mod:`hetero.core.memfit`'s line, ``fixed + per_sample · b``:
``fixed`` is its parts' training state, ``b`` the samples whose activations it holds at
once. Under GPipe every stage holds all ``M`` microbatches' activations before the first
backward; under 1F1B stage ``i`` of ``S`` holds at most ``min(S − i, M)`` (the first stage
most). The check is memfit's: the peak at most ``capacity · (1 − margin)``.

**The step time** of ``M`` microbatches through stages of times ``t_i`` (per microbatch,
forward and backward) is ``sum(t) + (M − 1) · max(t)``: the first microbatch crosses every
stage, and the others follow at the pace of the slowest. GPipe and 1F1B have the same
bubble, ``(S − 1)`` stage slots when stages are equal, and differ only in memory; this
model leaves out the transfers between stages (one activation a microbatch, small beside
a block's compute on the models that need pipelining) and the optimizer step.

**The solver** (:func:`partition`) is exact, not a heuristic. Devices keep the order
given (stage ``i`` on device ``i``: the pipeline's ranks). A first dynamic programme over
(stage, blocks so far) finds the least bottleneck ``B* = min max_i t_i`` over every
contiguous split whose stages fit their memory. A second one, among the splits whose
stages all take at most ``B*``, takes the least ``sum(t)`` (so the step time above is
least too), then the most even block counts (so that alike devices and alike blocks give
the even split). Both are ``O(S · N²)`` for ``N`` blocks: ``N`` is a model's layer count,
at most a few hundred. Every stage holds at least one block.

Pure: no torch; the trainer's profiler (``hetero.trainer.pipeline``) fills it in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from hetero.core.errors import PlanError
from hetero.core.memfit import GIB, MemoryFit


class Schedule(StrEnum):
    """The pipeline schedules modelled (``torch.distributed.pipelining``'s names)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


@dataclass(frozen=True)
class PartCost:
    """One part of a model, profiled at the microbatch size on the profiling device.

    ``seconds``: forward and backward of one microbatch (s, > 0 for a block);
    ``state_bytes``: its parameters' training state (parameter, gradient, optimizer);
    ``activation_bytes``: what one sample keeps for backward (bytes a sample)."""

    seconds: float
    state_bytes: float
    activation_bytes: float

    def __post_init__(self) -> None:
        if min(self.seconds, self.state_bytes, self.activation_bytes) < 0:
            raise ValueError(f"a part's costs are never negative: {self}")


NOTHING = PartCost(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Device:
    """A pipeline stage's device: ``speed`` over the profiling device's (> 0) and the
    bytes it may use (``capacity_bytes``, before the margin)."""

    speed: float
    capacity_bytes: float

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError(f"a device's speed must be positive, got {self.speed}")


@dataclass(frozen=True)
class Model:
    """A model as the solver sees it: ``head`` and ``tail`` go with the first and the
    last stage, ``blocks`` (at least one) are cut."""

    blocks: tuple[PartCost, ...]
    head: PartCost = NOTHING
    tail: PartCost = NOTHING


@dataclass(frozen=True)
class Pipeline:
    """How the stages run: ``microbatches`` a step of ``microbatch`` samples each."""

    microbatches: int
    microbatch: int
    schedule: Schedule = Schedule.ONE_F_ONE_B
    margin: float = 0.1

    def __post_init__(self) -> None:
        if self.microbatches < 1 or self.microbatch < 1:
            raise ValueError(f"microbatches and microbatch must be >= 1: {self}")

    def in_flight(self, stage: int, stages: int) -> int:
        """Microbatches whose activations stage ``stage`` of ``stages`` holds at once."""
        if self.schedule is Schedule.GPIPE:
            return self.microbatches
        return min(stages - stage, self.microbatches)


@dataclass(frozen=True)
class Partition:
    """The solver's answer: ``bounds[i]:bounds[i+1]`` are stage ``i``'s blocks; its time
    per microbatch on its device (s) and its predicted peak memory (bytes)."""

    bounds: tuple[int, ...]
    stage_seconds: tuple[float, ...]
    stage_peak_bytes: tuple[float, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Blocks per stage."""
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:], strict=False))

    @property
    def bottleneck(self) -> float:
        """The slowest stage's time per microbatch (s)."""
        return max(self.stage_seconds)


def step_seconds(stage_seconds: Sequence[float], microbatches: int) -> float:
    """A step of ``microbatches`` through stages of these times per microbatch (s), bubble
    included (module doc): ``sum + (M − 1) · max``."""
    return sum(stage_seconds) + (microbatches - 1) * max(stage_seconds)


def balanced_stage_seconds(model: Model, devices: Sequence[Device]) -> float:
    """Every stage's time per microbatch if blocks could be cut anywhere and the work were
    spread in proportion to speed: ``W / sum(speed)``, ``W`` the model's seconds on the
    profiling device. ``M`` times it bounds any split's step from below (the slowest
    stage is at least the speed-weighted mean)."""
    work = model.head.seconds + model.tail.seconds + sum(b.seconds for b in model.blocks)
    return work / sum(d.speed for d in devices)


def ideal_step_seconds(model: Model, devices: Sequence[Device], microbatches: int) -> float:
    """The step of that perfectly balanced split, bubble included (s): the ideal a split's
    step is compared with. Not a lower bound when ``microbatches`` is small: one stage
    doing almost everything on the fastest device has a smaller bubble."""
    return step_seconds([balanced_stage_seconds(model, devices)] * len(devices), microbatches)


def stage_cost(
    model: Model, devices: Sequence[Device], pipe: Pipeline, stage: int, start: int, stop: int
) -> tuple[float, float]:
    """Stage ``stage`` holding blocks ``start:stop``: its seconds per microbatch on its
    device and its predicted peak bytes (module doc)."""
    parts = list(model.blocks[start:stop])
    if stage == 0:
        parts.append(model.head)
    if stage == len(devices) - 1:
        parts.append(model.tail)
    seconds = math.fsum(p.seconds for p in parts) / devices[stage].speed
    line = MemoryFit(
        fixed_bytes=math.fsum(p.state_bytes for p in parts),
        per_sample_bytes=math.fsum(p.activation_bytes for p in parts),
        sizes=1,
    )
    held = pipe.microbatch * pipe.in_flight(stage, len(devices))
    return seconds, line.peak_bytes(held)


def _fits(device: Device, peak: float, margin: float) -> bool:
    return peak <= device.capacity_bytes * (1.0 - margin)


#: Secondary objective's grid, as a share of the model's seconds: splits whose sums of
#: stage times differ by rounding alone (the order fsum met them) count as equal, so the
#: even-count tie-break decides between them.
SUM_GRID = 1e-9


def _sum_units(seconds: float, work: float) -> int:
    return round(seconds / (work * SUM_GRID)) if work > 0 else 0


def partition(model: Model, devices: Sequence[Device], pipe: Pipeline) -> Partition:
    """The exact best contiguous split of ``model``'s blocks over ``devices`` (in pipeline
    order), as the module doc says; a ``PlanError`` in one line when no split fits."""
    n, s = len(model.blocks), len(devices)
    if s < 1 or n < s:
        raise PlanError(f"a pipeline of {s} stages needs at least {s} blocks; the model has {n}")
    cost: dict[tuple[int, int, int], tuple[float, float]] = {}
    for j in range(s):
        starts = range(j, n - (s - 1 - j)) if j > 0 else (0,)
        for a in starts:
            stops = range(a + 1, n - (s - 2 - j)) if j < s - 1 else (n,)
            for b in stops:
                secs, peak = stage_cost(model, devices, pipe, j, a, b)
                if _fits(devices[j], peak, pipe.margin):
                    cost[j, a, b] = (secs, peak)
    inf = math.inf
    # best[j][b]: the least bottleneck of stages 0..j holding blocks 0:b.
    best = [[inf] * (n + 1) for _ in range(s)]
    for (j, a, b), (secs, _) in sorted(cost.items()):  # stage by stage
        before = 0.0 if j == 0 else best[j - 1][a]
        best[j][b] = min(best[j][b], max(before, secs))
    bottleneck = best[s - 1][n]
    if bottleneck == inf:
        raise PlanError(_infeasible(model, devices, pipe))
    work = model.head.seconds + model.tail.seconds + sum(b.seconds for b in model.blocks)
    # Among splits with every stage <= bottleneck: least (sum of times, sum of squared
    # counts), both additive, so the programme is exact for that order too.
    key: list[list[tuple[int, int] | None]] = [[None] * (n + 1) for _ in range(s)]
    back: dict[tuple[int, int], int] = {}
    for (j, a, b), (secs, _) in sorted(cost.items()):
        if secs <= bottleneck:
            prior = (0, 0) if j == 0 else key[j - 1][a]
            if prior is None:
                continue
            cand = (prior[0] + _sum_units(secs, work), prior[1] + (b - a) ** 2)
            current = key[j][b]
            if current is None or cand < current:
                key[j][b] = cand
                back[j, b] = a
    bounds = [n]
    for j in range(s - 1, -1, -1):
        bounds.append(back[j, bounds[-1]])
    bounds.reverse()
    chosen = [cost[j, bounds[j], bounds[j + 1]] for j in range(s)]
    return Partition(tuple(bounds), tuple(c[0] for c in chosen), tuple(c[1] for c in chosen))


def _infeasible(model: Model, devices: Sequence[Device], pipe: Pipeline) -> str:
    total = stage_cost(model, [Device(1.0, 0.0)], pipe, 0, 0, len(model.blocks))[1]
    room = sum(d.capacity_bytes * (1 - pipe.margin) for d in devices)
    return (
        f"no split of {len(model.blocks)} blocks over {len(devices)} stages fits their memory: "
        f"the whole model needs {total / GIB:.2f} GiB at {pipe.microbatch} samples a "
        f"microbatch on one device, the stages have {room / GIB:.2f} GiB together "
        f"({pipe.margin:.0%} margin kept); fewer samples a microbatch, more stages, or "
        "sharding would help"
    )


def even_partition(model: Model, devices: Sequence[Device], pipe: Pipeline) -> Partition:
    """The split a speed-blind pipeline makes: block counts as equal as they go, the
    larger stages first; memory is not checked (what an even split would predict)."""
    n, s = len(model.blocks), len(devices)
    q, r = divmod(n, s)
    bounds = [0]
    for j in range(s):
        bounds.append(bounds[-1] + q + (1 if j < r else 0))
    costs = [stage_cost(model, devices, pipe, j, bounds[j], bounds[j + 1]) for j in range(s)]
    return Partition(tuple(bounds), tuple(c[0] for c in costs), tuple(c[1] for c in costs))


def measured_speeds(
    model: Model, bounds: Sequence[int], stage_seconds: Sequence[float]
) -> tuple[float, ...]:
    """Each stage's device speed as its run shows it: the profiled seconds of the parts it
    holds (on the profiling device) over the seconds a microbatch it measured (its own
    compute, the waits for its neighbours left out). With these speeds the same split's
    predicted stage times are the measured ones, and :func:`partition` re-cuts for them."""
    stages = len(stage_seconds)
    if len(bounds) != stages + 1:
        raise ValueError(f"{len(bounds) - 1} stages' bounds for {stages} measured stages")
    unit = [Device(1.0, math.inf)] * stages
    free = Pipeline(1, 1, margin=0.0)
    return tuple(
        stage_cost(model, unit, free, j, bounds[j], bounds[j + 1])[0] / stage_seconds[j]
        for j in range(stages)
    )
