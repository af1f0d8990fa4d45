"""Monotonicity: a rank known to be slower never holds more samples than a faster one.

Rank ``j`` is *confidently slower* than rank ``i`` when its fitted time is
larger at every batch a plan could give either of them, by more than the
noise of the two fits: ``t_j(b) > t_i(b) · (1 + z·√(σ_i² + σ_j²))`` at both
ends of ``[min_batch, B]`` (both models are affine, so then everywhere
between), with ``σ`` each fit's relative standard error
(``payback.level_sigma``).

With exact models the equal-time plan is monotone by itself: if ``b_j > b_i``
and ``j`` is slower at every batch then ``t_j(b_j) > t_j(b_i) > t_i(b_i)``,
so the times were not equal. Inversions come from elsewhere: rounding, the
trust region's bounds, and above all *one noisy interval*. A single bad
interval can look like a sudden change, and the fit of a rank with a
suspected change rests on that one point. So the order a plan must keep (``SpeedOrder.guard``) is the one known *with*
the newest interval together with the one known *before* it, where the newest
does not say the reverse: a reversal that the next interval confirms is then
acted on (the changed rank's older knowledge is no longer confident: its new
regime has one point), while one that it does not never moved a sample
across the order. A current plan that inverts a pair known both ways
(``SpeedOrder.settled``) is replaced whatever the gain.

``enforce_order`` repairs a plan by the least move: an inverted pair shares
its two batches equally (the faster rank takes the odd sample), which keeps
the sum, where both ranks' bounds allow it. Swapping the two batches instead
made a single noisy interval move a third of a 3-rank job's batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.model import StepModel
from hetero.core.balancer.payback import level_sigma
from hetero.core.balancer.plan import Batches, Box, Constraints
from hetero.core.balancer.robust_fit import RankFit

#: ``(faster, slower)`` rank pairs.
Order = frozenset[tuple[int, int]]


@dataclass(frozen=True)
class SpeedOrder:
    """``guard``: the pairs no plan may invert; ``settled``: those known both with and
    before the newest interval (a plan that inverts one is replaced at once)."""

    guard: Order = frozenset()
    settled: Order = frozenset()

    @classmethod
    def of(cls, now: Order, before: Order) -> SpeedOrder:
        kept = frozenset((i, j) for i, j in before if (j, i) not in now)
        return cls(now | kept, now & before)


def confident_order(
    models: Sequence[StepModel],
    fits: Sequence[RankFit],
    constraints: Constraints,
    *,
    z: float,
    default_cv: float,
) -> Order:
    """The pairs ``(i, j)`` in which ``j`` is confidently slower than ``i`` (module doc)."""
    ends = (float(constraints.min_batch), float(constraints.global_batch))
    sigma = [level_sigma(f, default_cv) for f in fits]
    pairs = set()
    for i, mi in enumerate(models):
        for j, mj in enumerate(models):
            if i == j:
                continue
            margin = 1.0 + z * math.hypot(sigma[i], sigma[j])
            if all(mj.time(b) > mi.time(b) * margin for b in ends):
                pairs.add((i, j))
    return frozenset(pairs)


def violations(plan: Sequence[int], order: Order) -> list[tuple[int, int]]:
    """The pairs of ``order`` that ``plan`` inverts (the slower rank holds more)."""
    return sorted((i, j) for i, j in order if plan[j] > plan[i])


def enforce_order(plan: Sequence[int], order: Order, box: Box) -> Batches:
    """``plan`` with each inverted pair of ``order`` sharing its batches equally (the
    faster rank takes the odd sample) where both ranks' bounds allow it."""
    out = list(plan)
    for _ in range(len(out) ** 2 + 1):  # each repair removes an inversion of a partial order
        repaired = False
        for i, j in violations(out, order):
            total = out[i] + out[j]
            bi, bj = total - total // 2, total // 2
            if box.lower[i] <= bi <= box.upper[i] and box.lower[j] <= bj <= box.upper[j]:
                out[i], out[j] = bi, bj
                repaired = True
        if not repaired:
            break
    return tuple(out)
