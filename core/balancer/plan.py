"""Plans and their constraints, and the integer arithmetic every policy shares.

A *plan* is the tuple of per-rank batch sizes ``(b_0, …, b_{W-1})`` whose sum is
the global batch ``B``. Policies produce real-valued targets; ``round_to_plan``
turns them into integers that sum to exactly ``B`` and respect each rank's
bounds ``[min_batch, cap_i]``, or the narrower ``Box`` a policy gives
(the trust region).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.errors import PlanError

Batches = tuple[int, ...]


@dataclass(frozen=True)
class Constraints:
    """What every plan must satisfy.

    ``max_batch`` holds one memory cap per rank (``None`` = unbounded); a cap
    comes from measured peak bytes per sample against the device's memory.

    ``comm_s`` is the per-step time, in seconds, that every rank spends after
    its own compute: the exposed (not overlapped) all-reduce plus anything else
    the whole job waits for. It delays every rank equally, so it never moves the
    equal-time split; it does enter predicted step times, throughput, the
    dead-band's relative threshold and exclusion forecasts. ``0.0`` (the
    default) leaves predictions compute-only.
    """

    global_batch: int
    world_size: int
    min_batch: int = 1
    max_batch: tuple[int | None, ...] | None = None
    comm_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.comm_s) and self.comm_s >= 0.0):
            raise PlanError(f"comm_s must be a finite number of seconds >= 0, got {self.comm_s}")
        if self.world_size < 1:
            raise PlanError(f"world_size must be >= 1, got {self.world_size}")
        if self.min_batch < 1:
            raise PlanError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.global_batch < self.min_batch * self.world_size:
            raise PlanError(
                f"global_batch {self.global_batch} is smaller than min_batch {self.min_batch} "
                f"x {self.world_size} ranks"
            )
        if self.max_batch is not None:
            if len(self.max_batch) != self.world_size:
                raise PlanError(
                    f"max_batch has {len(self.max_batch)} entries for {self.world_size} ranks"
                )
            if any(c is not None and c < self.min_batch for c in self.max_batch):
                raise PlanError(f"a memory cap in {self.max_batch} is below min_batch")
            if sum(self.upper(i) for i in range(self.world_size)) < self.global_batch:
                raise PlanError(
                    f"the ranks' memory caps {self.max_batch} cannot hold global_batch "
                    f"{self.global_batch}"
                )

    def upper(self, rank: int) -> int:
        """Largest batch rank ``rank`` may get (the global batch when uncapped)."""
        if self.max_batch is None or self.max_batch[rank] is None:
            return self.global_batch
        return min(self.global_batch, int(self.max_batch[rank] or 0))

    def check(self, batches: Sequence[int]) -> None:
        """Raise ``PlanError`` unless ``batches`` is a valid plan under these constraints."""
        if len(batches) != self.world_size:
            raise PlanError(
                f"plan {list(batches)} has {len(batches)} ranks, want {self.world_size}"
            )
        if sum(batches) != self.global_batch:
            raise PlanError(
                f"plan {list(batches)} sums to {sum(batches)}, want {self.global_batch}"
            )
        for rank, b in enumerate(batches):
            if not self.min_batch <= b <= self.upper(rank):
                raise PlanError(
                    f"rank {rank} batch {b} outside [{self.min_batch}, {self.upper(rank)}]"
                )


@dataclass(frozen=True)
class Box:
    """Per-rank bounds ``lower[i] <= b_i <= upper[i]`` (samples) that a plan must keep,
    inside the constraints' ``[min_batch, cap_i]``; they hold ``B``:
    ``Σ lower <= B <= Σ upper``."""

    lower: tuple[int, ...]
    upper: tuple[int, ...]

    @classmethod
    def of(cls, constraints: Constraints) -> Box:
        """The constraints' own bounds, ``[min_batch, cap_i]``."""
        world = constraints.world_size
        return cls(
            (constraints.min_batch,) * world,
            tuple(constraints.upper(r) for r in range(world)),
        )

    def holds(self, global_batch: int) -> bool:
        return sum(self.lower) <= global_batch <= sum(self.upper) and all(
            lo <= hi for lo, hi in zip(self.lower, self.upper, strict=True)
        )


def equal_batches(constraints: Constraints) -> Batches:
    """The DDP baseline: B/W each, the remainder spread over the first ranks."""
    return round_to_plan([1.0] * constraints.world_size, constraints)


def round_to_plan(
    weights: Sequence[float], constraints: Constraints, box: Box | None = None
) -> Batches:
    """Integer plan proportional to ``weights``, summing to B, within each rank's bounds.

    Ranks whose share would fall outside their bounds (``box``, default
    ``[min_batch, cap]``) are pinned to the bound and the rest of the batch is
    re-split among the others in proportion to their weights; then the
    largest-remainder method rounds to integers.
    """
    world = constraints.world_size
    if len(weights) != world:
        raise PlanError(f"{len(weights)} weights for {world} ranks")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise PlanError(f"weights must be finite and >= 0, got {list(weights)}")
    box = box or Box.of(constraints)
    lo = [float(b) for b in box.lower]
    hi = [float(b) for b in box.upper]
    targets = _clamped_split(list(weights), float(constraints.global_batch), lo, hi)
    return largest_remainder(targets, constraints, box)


def _clamped_split(
    weights: list[float], total: float, lo: list[float], hi: list[float]
) -> list[float]:
    """Real-valued split of ``total`` proportional to weights, clamped to [lo, hi]."""
    world = len(weights)
    pinned: dict[int, float] = {}
    while True:
        free = [i for i in range(world) if i not in pinned]
        remaining = total - sum(pinned.values())
        wsum = sum(weights[i] for i in free)
        if wsum <= 0:
            share = {i: remaining / len(free) for i in free} if free else {}
        else:
            share = {i: remaining * weights[i] / wsum for i in free}
        violated = {i: lo[i] for i in free if share[i] < lo[i]}
        violated.update({i: hi[i] for i in free if share[i] > hi[i]})
        if not violated:
            out = [0.0] * world
            for i, v in pinned.items():
                out[i] = v
            for i, v in share.items():
                out[i] = v
            return out
        pinned.update(violated)
        if len(pinned) == world:
            return [pinned[i] for i in range(world)]


def largest_remainder(
    targets: Sequence[float], constraints: Constraints, box: Box | None = None
) -> Batches:
    """Round real targets to integers summing to B within ``box`` (default the
    constraints' bounds), by largest remainder; a valid plan or ``PlanError``."""
    world = constraints.world_size
    box = box or Box.of(constraints)
    floors = [min(max(math.floor(t), box.lower[i]), box.upper[i]) for i, t in enumerate(targets)]
    deficit = constraints.global_batch - sum(floors)
    # Hand out (or take back) single samples by largest (smallest) remainder,
    # never crossing a rank's bounds. Ties go to the lower rank: deterministic.
    order = sorted(range(world), key=lambda i: (-(targets[i] - floors[i]), i))
    while deficit != 0:
        moved = False
        seq = order if deficit > 0 else list(reversed(order))
        for i in seq:
            if deficit == 0:
                break
            if deficit > 0 and floors[i] < box.upper[i]:
                floors[i] += 1
                deficit -= 1
                moved = True
            elif deficit < 0 and floors[i] > box.lower[i]:
                floors[i] -= 1
                deficit += 1
                moved = True
        if not moved:
            raise PlanError(f"cannot round {list(targets)} to a plan under {constraints}")
    plan = tuple(floors)
    constraints.check(plan)
    return plan
