"""Few batch shapes per rank: plans on a grid of sizes, and a preference for warm shapes.

Every batch size a rank has not run before costs it once: on GPUs the caching
allocator grows and cuDNN selects kernels for the new shapes (100–230 ms per
plan change measured with ResNet-50 on H200s). Two habits keep those costs
rare without giving up balance:

* **A grid.** Batches are multiples of ``g`` samples, so plans that differ by
  a sample or two are the same plan. ``g`` is the largest power of two no
  more than ``tolerance`` (2%) of the smallest target, so rounding to the
  grid costs at most about 1% of balance; small jobs get ``g = 1`` (no grid).
  ``B`` need not be a multiple of ``g``: the remainder ``B mod g`` goes to the
  rank with the largest share, the same rank plan after plan, so its shapes
  stay few as well. The sum is exactly ``B`` and the sampler is unchanged.
* **Warm shapes.** A rank's *warm* shapes are the batch sizes it ran in the
  history window. ``snap_to_warm`` moves a plan's ranks onto a warm shape
  within ``tolerance`` of their target where the sum can be kept exact by the
  other ranks, so a plan that differs from a recent one by a few samples
  reuses its shapes; the policy then chooses between the plain and the
  snapped plan by predicted step time net of switching cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetero.core.balancer.plan import Batches, Box, Constraints
from hetero.core.balancer.stats import History

#: Largest grid step relative to the smallest target batch (see the module doc).
GRID_TOLERANCE = 0.02


def grid_step(targets: Sequence[float], tolerance: float = GRID_TOLERANCE) -> int:
    """The largest power of two ``<= tolerance × min(targets)``; at least 1."""
    smallest = min(targets) if targets else 0.0
    room = tolerance * smallest
    if room < 2:
        return 1
    return 1 << math.floor(math.log2(room))


def grid_round(
    targets: Sequence[float], constraints: Constraints, box: Box, g: int
) -> Batches | None:
    """Integer plan summing to B within ``box``: every rank on a multiple of ``g``
    except that the rank with the largest target also takes ``B mod g``. None if
    the box leaves no such plan (too narrow for the grid)."""
    if g <= 1:
        return None
    world = constraints.world_size
    total = constraints.global_batch
    rest = total % g
    extra_rank = max(range(world), key=lambda i: (targets[i], -i))
    extra = [rest if i == extra_rank else 0 for i in range(world)]
    lo = [math.ceil((box.lower[i] - extra[i]) / g) for i in range(world)]
    hi = [math.floor((box.upper[i] - extra[i]) / g) for i in range(world)]
    units = _round_units(
        [(t - e) / g for t, e in zip(targets, extra, strict=True)], total // g, lo, hi
    )
    if units is None:
        return None
    plan = tuple(g * u + e for u, e in zip(units, extra, strict=True))
    constraints.check(plan)
    return plan


def _round_units(
    targets: Sequence[float], total: int, lo: Sequence[int], hi: Sequence[int]
) -> list[int] | None:
    """Integers within ``[lo, hi]`` summing to ``total``, nearest ``targets`` by largest
    remainder; None if the bounds cannot hold the total."""
    if any(a > b for a, b in zip(lo, hi, strict=True)) or not sum(lo) <= total <= sum(hi):
        return None
    out = [min(max(math.floor(t), a), b) for t, a, b in zip(targets, lo, hi, strict=True)]
    deficit = total - sum(out)
    order = sorted(range(len(out)), key=lambda i: (-(targets[i] - out[i]), i))
    while deficit:
        for i in order if deficit > 0 else reversed(order):
            if deficit > 0 and out[i] < hi[i]:
                out[i] += 1
                deficit -= 1
            elif deficit < 0 and out[i] > lo[i]:
                out[i] -= 1
                deficit += 1
            if not deficit:
                break
    return out


def warm_shapes(history: History) -> tuple[frozenset[int], ...]:
    """Per rank, the batch sizes it ran in ``history`` (intervals of the newest world size)."""
    if not history:
        return ()
    world = len(history[-1])
    seen: list[set[int]] = [set() for _ in range(world)]
    for iv in history:
        if len(iv) != world:
            continue
        for r, ri in enumerate(iv):
            if ri.steps > 0 and ri.batch > 0:
                seen[r].add(ri.batch)
    return tuple(frozenset(s) for s in seen)


def snap_to_warm(
    plan: Sequence[int],
    warm: Sequence[frozenset[int]],
    constraints: Constraints,
    box: Box,
    tolerance: float = GRID_TOLERANCE,
) -> Batches | None:
    """``plan`` with ranks moved onto a warm shape within ``tolerance`` of their batch
    (at least one sample), the sum kept exactly B by the largest rank left cold.
    None when nothing moved or the sum cannot be kept."""
    out = list(plan)
    snapped: list[int] = []
    for rank, b in enumerate(plan):
        shapes = warm[rank] if rank < len(warm) else frozenset()
        near = [
            w
            for w in shapes
            if abs(w - b) <= max(1.0, tolerance * b) and box.lower[rank] <= w <= box.upper[rank]
        ]
        if b in shapes or not near:
            continue
        out[rank] = min(near, key=lambda w: (abs(w - b), w))
        snapped.append(rank)
    if not snapped:
        return None
    diff = constraints.global_batch - sum(out)
    free = sorted((r for r in range(len(out)) if r not in snapped), key=lambda r: -out[r])
    while diff and free:
        r = free.pop(0)
        moved = min(max(out[r] + diff, box.lower[r]), box.upper[r])
        diff -= moved - out[r]
        out[r] = moved
    if diff:
        return None
    result = tuple(out)
    constraints.check(result)
    return result
