"""How noisy one rank's interval times are, measured so that changes of speed do not count.

The balancer needs the noise of a single interval's time at a given batch: it
sets how large a jump is a change of speed and not noise (``changepoint``),
how well a fixed cost is known (``robust_fit``), and how large a predicted
gain is real (``payback``). Hosts differ by more than an order of magnitude:
a dedicated GPU repeats an interval to within 1%, a 2-core CPU box shared with
other processes swings by 30% from one interval to the next.

**Estimator.** Consecutive intervals that ran (about) the same batch differ
only by noise, unless the speed changed between them. So the noise is read
from the log-ratios ``r`` of the per-sample times of consecutive points whose
batches differ by at most ``SAME_BATCH`` (10%). The largest 40% of the ``r²``
are dropped (a one-off outlier spoils two pairs, a change one), the rest are
taken about the median ratio (slow drift, such as a GPU heating up, moves every
ratio alike and is not noise), and their mean, divided by what that trimming leaves of a Gaussian's variance
(``TRIMMED_SHARE``), estimates ``2σ²``. A median of a handful of
ratios came out near zero by chance often enough on a loaded CPU box to make
one noisy interval look like certain knowledge; the trimmed mean does not.
Fewer than ``MIN_PAIRS`` pairs measure nothing.

**Drift** is what that leaves out: a level that wanders over several intervals
(a host whose load builds up for minutes; on a 2-core box running three ranks,
the rank with the largest batch got less of a core as the run went on) moves
consecutive intervals alike. Averaging intervals then buys less than their
number says, and ``serial_correlation`` measures by how much: the lag-1
correlation of a rank's residuals about its fitted level, oldest first.
Negative values (noise that alternates) are taken as 0, so they never claim
more than independent intervals, and from fewer than ``SERIAL_POINTS``
residuals none is read (0). On independent noise the estimate from ``n``
points averages about ``−1/n`` with a spread of about ``1/√n``: it is 0 in
over half the draws and small otherwise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

#: ``(batch samples, seconds per step)``, one per interval, oldest first.
Point = tuple[int, float]

#: Largest relative difference of two batches whose per-sample times are compared.
SAME_BATCH = 0.10
#: Fewest consecutive pairs a noise estimate is read from.
MIN_PAIRS = 4
#: Share of the pairs kept (the smallest ``r²``).
KEEP = 0.6
#: ``E[z² | z² <= q]`` for a standard normal ``z`` and ``q`` the 60% quantile of ``z²``:
#: the trimmed mean of ``r²`` over this is the variance of ``r``.
TRIMMED_SHARE = 0.2145
#: Fewest residuals a serial correlation is read from.
SERIAL_POINTS = 6


def interval_noise(points: Sequence[Point]) -> float | None:
    """Relative noise (one standard deviation) of one interval's time; None if fewer
    than ``MIN_PAIRS`` consecutive pairs ran about the same batch."""
    ratios = [
        math.log((t1 / b1) / (t0 / b0))
        for (b0, t0), (b1, t1) in itertools.pairwise(points)
        if b0 > 0 and b1 > 0 and t0 > 0 and t1 > 0 and abs(b1 / b0 - 1.0) <= SAME_BATCH
    ]
    if len(ratios) < MIN_PAIRS:
        return None
    ratios.sort()
    m = len(ratios) // 2
    drift = ratios[m] if len(ratios) % 2 else 0.5 * (ratios[m - 1] + ratios[m])
    squares = sorted((r - drift) ** 2 for r in ratios)
    kept = squares[: max(2, round(KEEP * len(squares)))]
    variance_of_ratio = sum(kept) / len(kept) / TRIMMED_SHARE
    return math.sqrt(variance_of_ratio / 2.0)


def serial_correlation(residuals: Sequence[float]) -> float:
    """Lag-1 correlation of ``residuals`` (oldest first), at least 0; 0 from fewer than
    ``SERIAL_POINTS`` or where they do not vary."""
    if len(residuals) < SERIAL_POINTS:
        return 0.0
    mean = sum(residuals) / len(residuals)
    centred = [r - mean for r in residuals]
    total = sum(d * d for d in centred)
    if total <= 0.0:
        return 0.0
    lagged = sum(d0 * d1 for d0, d1 in itertools.pairwise(centred))
    return max(lagged / total, 0.0)
