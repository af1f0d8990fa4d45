"""The trust region: how far a new plan may take a rank beyond the batches its fit has seen.

A rank's model ``t(b) = a·b + c`` passes through the rank's recent points, so
near the batches it ran its prediction is as good as the measurements. Far
from them it is an extrapolation, and an error in ``c`` grows with the
distance: a model whose ``c`` is off by a fifth of the step time predicts
twice its batch 20% wrong, four times its batch 60% wrong. One noisy interval
must not fling samples on such an extrapolation, so each rank's next batch
stays within ``[lo / factor, hi · factor]`` of the range ``[lo, hi]`` its
current regime has run, and at least ``step`` samples beyond it: a quarter of
an equal share (``B / 4W``). A factor alone moves a rank at a handful of
samples by a sample or two per interval: a 2-rank job started by misread
hardware profiles at 61/3 would crawl out of it for ten intervals, each move
too small to beat the noise. A quarter share bounds what one wrong model can
move to a quarter of what an equal split gives a rank.

``factor = 2`` (the default) is one doubling or halving per interval. It is
enough for the moves that matter: from an equal start, a 3-rank job of 1×, 2×
and 3× speeds needs ×1.64 and ×0.55 (one move); a neighbour that makes one of
two GPUs 2.5× slower needs the other to take ×1.42. With ``c`` known to 10% of
the step (``robust_fit.MAX_FIXED_SE``) a prediction at twice the batches seen
is off by at most about 10%.

A rank whose speed regime just changed (the newest interval started it) has
no evidence at its new speed except that one point, and its old range is no
evidence at all, so its bounds are the constraints' own: the change is acted
on at once. If the bounds cannot hold the global batch (every rank's range is
narrow and far from the new optimum), the factor is squared until they can.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetero.core.balancer.plan import Box, Constraints
from hetero.core.balancer.robust_fit import RankFit


def trust_box(
    fits: Sequence[RankFit], constraints: Constraints, *, factor: float, step: int | None = None
) -> Box:
    """Per-rank bounds for the next plan (see the module doc); always holds ``B``.
    ``step``: the least reach beyond the range seen, samples (default ``B / 4W``)."""
    base = Box.of(constraints)
    if step is None:
        step = max(1, math.ceil(constraints.global_batch / (4 * constraints.world_size)))
    f = factor
    for _ in range(8):
        box = _box(fits, base, f, step)
        if box.holds(constraints.global_batch):
            return box
        f = f * f
    return base


def _box(fits: Sequence[RankFit], base: Box, factor: float, step: int) -> Box:
    lower: list[int] = []
    upper: list[int] = []
    for rank, fit in enumerate(fits):
        lo_base, hi_base = base.lower[rank], base.upper[rank]
        seen_lo, seen_hi = fit.seen
        if fit.changed_at_newest or seen_lo <= 0:
            lower.append(lo_base)
            upper.append(hi_base)
            continue
        lo = min(math.floor(seen_lo / factor), seen_lo - step)
        hi = max(math.ceil(seen_hi * factor), seen_hi + step)
        lower.append(min(max(lo, lo_base), hi_base))
        upper.append(max(min(hi, hi_base), lo_base))
    return Box(tuple(lower), tuple(upper))
