"""Monotonicity: a rank known to be slower never holds more samples than a faster one.

Whether ``j`` holding more than ``i`` is an inversion depends on where: with
fixed costs alike, two ranks take about the same time at a batch of one
sample whatever their speeds. What matters is the pair's own batches. If a
plan gives ``b_j > b_i`` and ``j`` is slower at the middle batch
``m = (b_i + b_j)/2``, then ``t_j(b_j) > t_j(m) > t_i(m) > t_i(b_i)``: the
pair cannot be balanced, and giving ``j`` fewer is better. So rank ``j`` is
*confidently slower* than ``i`` at ``m`` when
``t_j(m) > t_i(m) · (1 + z·√(σ_i² + σ_j²))``, ``σ`` each fit's relative
standard error (``payback.level_sigma``).

With exact models the equal-time plan has no such pair. Inversions come from
rounding, the trust region's bounds, and above all *one noisy interval*: a
single bad interval can look like a sudden change, and the fit of a rank with
a suspected change rests on that one point. So the knowledge a plan must
respect (``SpeedOrder.inverted``) is the one *with* the newest interval
together with the one *before* it, where the newest does not say the reverse:
a reversal that the next interval confirms is then acted on (the changed
rank's older knowledge is no longer confident: its new regime has one point),
while one that it does not never moved a sample across the order. A current
plan that inverts a pair known both ways (``settled``) is replaced whatever
the gain.

``SpeedOrder.enforce`` repairs a plan by the least move: an inverted pair
shares its two batches equally (the faster rank takes the odd sample), which
keeps the sum, where both ranks' bounds allow it. Swapping the two batches
instead let a single noisy interval move a third of a 3-rank job's batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.model import StepModel
from hetero.core.balancer.payback import level_sigma
from hetero.core.balancer.plan import Batches, Box
from hetero.core.balancer.robust_fit import RankFit


@dataclass(frozen=True)
class Speeds:
    """Fitted models and their relative standard errors, as known at one time."""

    models: tuple[StepModel, ...]
    sigma: tuple[float, ...]

    @classmethod
    def of(cls, models: Sequence[StepModel], fits: Sequence[RankFit], default_cv: float) -> Speeds:
        """The fits' errors; a rank with an input pipeline counts its rate's error too
        (wherever the pipeline may set its time, the order rests on that rate)."""
        return cls(
            tuple(models), tuple(max(level_sigma(f, default_cv), f.input_sigma) for f in fits)
        )

    def slower(self, i: int, j: int, batch: float, z: float) -> bool:
        """Whether rank ``j`` is confidently slower than rank ``i`` at ``batch``."""
        margin = 1.0 + z * math.hypot(self.sigma[i], self.sigma[j])
        return self.models[j].time(batch) > self.models[i].time(batch) * margin


@dataclass(frozen=True)
class SpeedOrder:
    """What is known of the ranks' speeds with the newest interval (``now``) and before
    it (``before``; None with a single interval), at ``z`` standard errors."""

    now: Speeds | None = None
    before: Speeds | None = None
    z: float = 2.0

    def inverted(self, plan: Sequence[int], i: int, j: int, *, settled: bool = False) -> bool:
        """Whether ``plan`` gives ``j`` more than ``i`` though ``j`` is known to be slower
        at their middle batch; ``settled``: known both with and before the newest."""
        if plan[j] <= plan[i] or self.now is None:
            return False
        m = 0.5 * (plan[i] + plan[j])
        now = self.now.slower(i, j, m, self.z)
        before = self.before is not None and self.before.slower(i, j, m, self.z)
        if settled:
            return now and before
        return now or (before and not self.now.slower(j, i, m, self.z))

    def violations(self, plan: Sequence[int], *, settled: bool = False) -> list[tuple[int, int]]:
        """The ``(faster, slower)`` pairs ``plan`` inverts."""
        world = len(plan)
        return [
            (i, j)
            for i in range(world)
            for j in range(world)
            if i != j and self.inverted(plan, i, j, settled=settled)
        ]

    def enforce(self, plan: Sequence[int], box: Box) -> Batches:
        """``plan`` with each inverted pair sharing its batches equally (the faster rank
        takes the odd sample) where both ranks' bounds allow it."""
        out = list(plan)
        for _ in range(len(out) ** 2 + 1):  # each repair removes an inversion
            repaired = False
            for i, j in self.violations(out):
                total = out[i] + out[j]
                bi, bj = total - total // 2, total // 2
                if box.lower[i] <= bi <= box.upper[i] and box.lower[j] <= bj <= box.upper[j]:
                    out[i], out[j] = bi, bj
                    repaired = True
            if not repaired:
                break
        return tuple(out)
