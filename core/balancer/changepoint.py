"""Where a rank's current speed regime began: sudden changes versus one-off outliers.

A rank's interval points ``(batch, compute seconds)`` come from one affine model
``t = a·b + c`` (``a, c ≥ 0``) while the device's speed holds. A neighbour
process arriving or leaving, a clock drop or a thermal trip makes newer points
inconsistent with older ones. Fitting across such a change averages two
devices that no longer exist, so the fitter uses only the current regime's
points (and carries over what did not change, the fixed cost, when the new
regime cannot identify it yet).

**Consistency without knowing the fixed cost.** From a reference point
``(b₀, t₀)`` any non-negative affine model predicts, at batch ``b``,
``t = t₀·b/b₀ + c·(1 − b/b₀)`` for some ``c ∈ [0, t₀]``: a value between
``t₀·b/b₀`` (no fixed cost) and ``t₀`` (all fixed cost). A point is
*consistent* with the reference when it lies in that band widened by the
relative ``threshold`` on each side (in log space, so slow-downs and speed-ups
are treated alike). At an unchanged batch the band is just ``t₀·(1 ± thr)``;
after a large plan move it is wide, so a plan move is never mistaken for a
change of speed.

**Change or outlier.** A point that is inconsistent with the last accepted
point starts a new regime if the point after it agrees with it (a confirmed
change) or if it is the newest point (a suspected change: acting on it at once
is what lets the plan re-converge one interval after a neighbour arrives).
Otherwise it is an outlier, a one-off interval (a checkpoint save, a GC pause,
an interval that straddles a change) and is left out of every fit. A suspected
change that the next interval does not confirm becomes an outlier on the next
call: the cost of reacting at once is at most one interval on a wrong plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: ``(batch samples, mean compute seconds per step)``, one per interval, oldest first.
Point = tuple[int, float]


@dataclass(frozen=True)
class Regime:
    """How a rank's points split into speed regimes.

    ``starts`` holds the index of each regime's first point, ascending; the
    first is always 0 and the last is the current regime. ``outliers`` are the
    indices of points that belong to no regime.
    """

    starts: tuple[int, ...]
    outliers: tuple[int, ...]

    @property
    def start(self) -> int:
        """Index of the current regime's first point."""
        return self.starts[-1]

    def members(self, which: int, n_points: int) -> list[int]:
        """Indices of the non-outlier points of regime ``which`` (``-1`` = current)."""
        k = which % len(self.starts)
        lo = self.starts[k]
        hi = self.starts[k + 1] if k + 1 < len(self.starts) else n_points
        dropped = set(self.outliers)
        return [i for i in range(lo, hi) if i not in dropped]


def consistent(reference: Point, point: Point, threshold: float) -> bool:
    """Whether ``point`` fits some non-negative affine model through ``reference``.

    ``threshold`` is the relative tolerance (0.15 = 15%) for noise and slow drift.
    """
    b0, t0 = reference
    b, t = point
    if b0 <= 0 or t0 <= 0 or t <= 0:
        return False
    scaled = t0 * b / b0
    if not 0 < scaled < math.inf:
        return False  # a batch of 0, or a product that under- or overflowed
    tol = math.log1p(threshold)
    lo = math.log(min(t0, scaled)) - tol
    hi = math.log(max(t0, scaled)) + tol
    return lo <= math.log(t) <= hi


def find_regimes(points: Sequence[Point], threshold: float) -> Regime:
    """Split ``points`` (oldest first) into speed regimes and one-off outliers."""
    n = len(points)
    starts = [0]
    outliers: list[int] = []
    reference: Point | None = None
    for k, point in enumerate(points):
        if reference is None or consistent(reference, point, threshold):
            reference = point
            continue
        if k == n - 1 or consistent(point, points[k + 1], threshold):
            starts.append(k)
            reference = point
        else:
            outliers.append(k)
    return Regime(tuple(starts), tuple(outliers))
