"""The load every rank shares: estimated per interval and divided out before fitting.

On a host whose ranks share CPUs (or memory bandwidth, or a file system), most
of the swing from one interval to the next hits every rank at once: in a
3-rank CPU job on a loaded 2-core box, all three ranks ran 1.6–2.0× slower in
the same interval and back again in the next. A per-rank fit sees each swing
as noise or, worse, as a change of speed on every rank.

The equal-time plan does not depend on such a factor: scaling every ``a_i``
and ``c_i`` by ``L`` scales ``T`` by ``L`` and leaves every
``b_i = (T − c_i)/a_i`` unchanged. So the fit may divide each interval's times
by the interval's shared load without changing what the right plan is, and
what remains is the ranks' speeds *relative to each other*, which is what the
plan needs. Times stay in seconds at the newest interval's load, so predicted
step times and gains are those of now.

**Estimate.** With a first fit ``m_i`` of each rank, the interval's load is
the median over ranks of ``log(t_ik / m_i(b_ik))`` (the rank's time over its
model), taken relative to the newest interval. A rank whose own speed changed
moves the median little with three or more ranks. With two, the median is
the mean of both, which splits a one-rank change (or one rank's noisy
interval) into a change on both ranks: both would be freed from the trust
region at once, and one interval could fling samples either way. So the load
is divided out only from ``MIN_SHARED_RANKS`` (3) ranks on; two ranks see
their shared swings as noise, which makes their planner more careful.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetero.core.balancer.model import StepModel

#: Fewest ranks whose median can tell a shared load from one rank's change.
MIN_SHARED_RANKS = 3
#: Per interval, per rank: ``(batch, seconds)`` or None where the rank measured nothing.
Grid = Sequence[Sequence[tuple[int, float] | None]]


def load_factors(points: Grid, models: Sequence[StepModel]) -> list[float]:
    """Each interval's shared load relative to the newest interval's (1.0 = the same);
    all 1.0 with fewer than two ranks or nothing measured."""
    logs: list[float | None] = []
    for row in points:
        residuals = sorted(
            math.log(p[1] / models[r].time(p[0]))
            for r, p in enumerate(row)
            if p is not None and p[1] > 0 and models[r].time(p[0]) > 0
        )
        logs.append(_median(residuals) if len(residuals) >= 2 else None)
    newest = next((g for g in reversed(logs) if g is not None), None)
    if newest is None:
        return [1.0] * len(points)
    return [1.0 if g is None else math.exp(g - newest) for g in logs]


def divide_load(points: Grid, factors: Sequence[float]) -> list[list[tuple[int, float] | None]]:
    """``points`` with each interval's times divided by its load factor."""
    return [
        [None if p is None else (p[0], p[1] / f) for p in row]
        for row, f in zip(points, factors, strict=True)
    ]


def _median(values: Sequence[float]) -> float:
    m = len(values) // 2
    return values[m] if len(values) % 2 else 0.5 * (values[m - 1] + values[m])
