"""Robust per-rank fit of ``t(b) = a·b + c`` from interval points.

Each rebalance interval gives one point per rank: its batch and its mean
compute-only seconds per step. Three things make a plain least-squares fit
over the last few points wrong in practice, and each has a remedy here:

* **Outliers** (a checkpoint save inside an interval, a GC pause): Huber
  M-estimation by iteratively reweighted least squares, on relative residuals
  because step-time noise is multiplicative. Points the change detector calls
  outliers are dropped before fitting.
* **Sudden changes** (a neighbour arrives): only the current regime's points
  are fitted (``changepoint.find_regimes``). A jump counts as a change only
  if it exceeds ``change_threshold`` and ``CHANGE_SIGMAS`` times the rank's
  interval noise (``noise.interval_noise``): on a loaded CPU box, where
  intervals swing by 30%, a fixed 15% threshold called every other interval
  a change of speed, and each "change" threw the fit's evidence away. The
  newest point alone is acted on at once only on a quiet rank: one whose
  interval noise is under ``CONFIRM_NOISE`` (5%) and whose window holds fewer
  than ``HEAVY_TAIL_OUTLIERS`` one-off outliers. On a noisy rank one interval
  cannot tell a change from noise, and outliers mean heavier tails than the
  noise says (a CPU rank the scheduler starves for one interval); there a
  jump in the newest interval waits for the next one to confirm it
  (``RankFit.pending``), one interval of lag against a plan flung by noise.
* **Too little spread in b to identify c.** Once a plan has converged every
  point sits at one batch size and the fixed cost ``c`` is unidentifiable. It
  is estimated from the regime's whole history (old points, from before the
  plan converged, have the spread), else carried over from the previous
  regime (a clock drop slows the per-sample work, not kernel launches),
  else taken from a prior, else 0. A line through points whose batches barely
  spread *relative to their noise* extrapolates noise: two noisy intervals at
  16 and 18 samples gave a fixed cost near the whole step time, hence a tiny
  slope, and the next plan handed that rank four times its samples (the
  limit cycle 53/11 → 20/44 → 44/20 of a 2-rank CPU job). So ``c`` is taken
  from a line only when its standard error is at most ``MAX_FIXED_SE`` of the
  mean step time. The noise behind that error is the larger of the line's
  own residuals and the rank's interval noise, so two points far apart on a
  quiet GPU identify ``c`` at once while a loaded CPU box never does. A
  regime that began with a change of speed is the exception: there the
  fallback is the earlier regime's ``c``, which the change may have made
  wrong (a neighbour that time-slices a GPU adds mostly a fixed cost), so the
  new regime's own levels are used up to ``MAX_LEVELS_SE``. The first move
  after the change (``moves.first_move_bound``) puts a second level at a
  batch far from the first, and the second move jumps to the optimum those
  two levels fit instead of closing part of the gap each time
  (330 -> 338 -> 354 -> 370 at 3% noise, where 364 was right).
  The per-sample cost ``a`` is then a recency-weighted Huber mean of
  ``(t − c)/b`` over the newest points, so the model always passes through
  where the rank runs now and follows drift. That mean is worth ``n_eff``
  intervals if they are independent; how far the residuals of the regime's
  points about the model persist from one interval to the next
  (``noise.serial_correlation``) says how much less a wandering level gives
  (``payback.level_sigma``). Points at other batches that sit off the model
  (a ``c`` that is off) read as correlated as well, and rightly: the level
  where the rank runs is then less certain.
  A wrong ``c`` only mis-sizes the next move, never the fixed point: when the
  fitted times at the current plan are equal, the equal-time solve returns the
  current plan whatever the slopes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.changepoint import Point, Regime, find_regimes
from hetero.core.balancer.model import StepModel
from hetero.core.balancer.noise import interval_noise, serial_correlation

#: Huber's tuning constant: 95% efficiency under Gaussian noise.
HUBER_DELTA = 1.345
#: Robust scale floor (relative): noise-free data must not make every residual an outlier.
MIN_SCALE = 1e-3
#: Smallest per-sample cost a fit may return, seconds; keeps the equal-time solve finite.
MIN_PER_SAMPLE_S = 1e-12
#: One-off outliers in a rank's window from which its newest jump needs confirmation.
HEAVY_TAIL_OUTLIERS = 2
#: Interval noise from which a rank's newest jump needs confirmation.
CONFIRM_NOISE = 0.05
#: Relative standard error of a rank's level that the per-sample mean aims for: where
#: the noise needs more than ``window`` points for it, the mean averages longer.
LEVEL_TARGET = 0.03
#: A jump counts as a change of speed only beyond this many standard deviations of the
#: rank's interval noise (and beyond ``change_threshold``).
CHANGE_SIGMAS = 3.0
#: Largest standard error of a fitted fixed cost, relative to the mean step time, for the
#: line's ``c`` to be used: known to 10% of the step, a wrong ``c`` mis-sizes a move by
#: at most ~10% of the step even at twice the batches seen (the trust region's reach).
MAX_FIXED_SE = 0.10
#: Spread of an interval's own steps (``RankInterval.busy_cv``) from which the interval
#: that began a regime is taken to straddle the change, when it is also ``STRADDLE_RATIO``
#: times the rank's typical spread: its median mixes the two speeds, so it dates the
#: change but is no level of the new regime. On 2x H100 the interval into which a matmul
#: neighbour arrived spread by 21% and 56% against at most 5% for every other interval.
STRADDLE_SPREAD = 0.10
STRADDLE_RATIO = 3.0
#: The same bound for a regime that began with a change of speed, where the fallback is
#: the earlier regime's fixed cost: two levels of the new regime that know ``c`` to a
#: quarter of the step know it better than a regime the change may have made wrong.
MAX_LEVELS_SE = 0.25


@dataclass(frozen=True)
class RankFit:
    """One rank's fitted model and where its data came from.

    ``regime`` indexes into the points that were fitted; ``fixed_from`` says
    which evidence set ``fixed_s``: ``"regime"``, ``"regime levels"`` (the
    looser bound after a change), ``"earlier regime"``,
    ``"prior"`` or ``"none"`` (then ``fixed_s = 0``). ``per_sample_cv`` is the
    robust relative spread of the per-sample values behind ``per_sample_s``
    (``None`` from fewer than three points) and ``n_eff`` their effective
    number under the recency weights, ``(Σw)²/Σw²``: together they say how
    well ``per_sample_s`` is known. ``serial_corr`` is the lag-1 correlation of
    the current regime's residuals about the model (``noise.serial_correlation``,
    0 from fewer than ``noise.SERIAL_POINTS``): how much of that number a
    wandering level takes away. ``noise_cv`` is the relative noise of one
    interval's time: ``noise.interval_noise`` over all the rank's points (noise
    is the host's, it outlives a change of speed), else the larger of the
    caller's prior and ``per_sample_cv``, else the previous regime's spread;
    ``None`` when nothing measures it yet.
    ``seen`` is the smallest and largest batch among the current regime's
    points: where the model has evidence (the trust region grows from it).
    ``pending``: the newest point jumped, but this rank is too noisy to call one
    interval a change: it waits for the next (and is left out meanwhile).
    ``input_sigma``: the relative standard error of the model's input rate
    (``StepModel.input_per_sample_s``; 0 without one), set by the policy that
    measured it (``dynamic``), not by this fit.
    ``noise_measured``: ``noise_cv`` rests on this job's numbers (consecutive
    intervals, the steps' own spread or the model's residuals), not on the
    caller's assumed prior alone.
    """

    model: StepModel
    regime: Regime
    n_points: int
    fixed_from: str
    per_sample_cv: float | None = None
    n_eff: float = 1.0
    noise_cv: float | None = None
    seen: tuple[int, int] = (0, 0)
    pending: bool = False
    serial_corr: float = 0.0
    input_sigma: float = 0.0
    noise_measured: bool = False

    @property
    def changed_at_newest(self) -> bool:
        """The newest point started a new regime (a suspected sudden change)."""
        start: int = self.regime.start
        return 0 < start == self.n_points - 1


def robust_scale(values: Sequence[float]) -> float:
    """Median absolute deviation scaled to a Gaussian sigma (1.4826·MAD)."""
    if not values:
        return 0.0
    med = _median(values)
    return 1.4826 * _median([abs(v - med) for v in values])


def huber_mean(values: Sequence[float], weights: Sequence[float], iterations: int = 20) -> float:
    """Weighted Huber location of positive ``values``, on relative residuals."""
    loc = _weighted_median(values, weights)
    # The scale stays the one around the median, for the reason given in huber_line.
    scale = max(robust_scale([(v - loc) / loc for v in values]), MIN_SCALE)
    for _ in range(iterations):
        rel = [(v - loc) / loc for v in values]
        w = [wi * _huber_weight(r, scale) for wi, r in zip(weights, rel, strict=True)]
        new = sum(wi * v for wi, v in zip(w, values, strict=True)) / sum(w)
        if abs(new - loc) <= 1e-12 * loc:
            return new
        loc = new
    return loc


def huber_line(
    points: Sequence[Point], weights: Sequence[float], iterations: int = 20
) -> tuple[float, float]:
    """Weighted Huber fit of ``t = a·b + c``; returns ``(a, c)``. Needs two distinct b.

    Starts from Theil-Sen (median of pairwise slopes) and keeps the noise scale
    of that start fixed while reweighting: least squares as a start, or a scale
    re-estimated from residuals the outlier has already distorted, lets one
    gross outlier drag a fit of a handful of points by several percent.
    """
    bs = [float(b) for b, _ in points]
    ts = [t for _, t in points]
    a, c = _theil_sen(bs, ts)
    scale = max(
        robust_scale([(t - (a * b + c)) / t for b, t in zip(bs, ts, strict=True)]), MIN_SCALE
    )
    for _ in range(iterations):
        rel = [(t - (a * b + c)) / t for b, t in zip(bs, ts, strict=True)]
        w = [wi * _huber_weight(r, scale) for wi, r in zip(weights, rel, strict=True)]
        a_new, c_new = _weighted_line(bs, ts, w)
        if abs(a_new - a) <= 1e-12 * abs(a) and abs(c_new - c) <= 1e-12 * max(abs(c), 1e-9):
            return a_new, c_new
        a, c = a_new, c_new
    return a, c


def fit_rank(
    points: Sequence[Point],
    *,
    window: int = 8,
    recency: float = 0.7,
    fixed_recency: float = 0.9,
    min_spread: float = 0.05,
    change_threshold: float = 0.15,
    prior_fixed_s: float | None = None,
    noise_prior: float | None = None,
    change_noise: float | None = None,
    step_noise: float | None = None,
    spreads: Sequence[float | None] | None = None,
) -> RankFit:
    """Fit one rank's step model from its points, oldest first (see the module doc).

    ``window`` newest points of the current regime set the per-sample cost,
    the newest weighing 1 and each older ``recency`` times less; the fixed cost
    comes from the whole regime weighted by ``fixed_recency`` per point of age,
    if the regime's batches spread by at least ``min_spread`` (range over mean).
    ``noise_prior`` is the interval noise assumed until the points measure it;
    ``change_noise``, a floor under it for telling a change from noise (the noise
    of the rank's raw times where the caller divided a shared load out of
    ``points``: dividing by the median rank's times leaves that rank's series too
    smooth to judge one interval by); ``step_noise``, the noise of one interval's
    time implied by the spread of its own steps, which marks a rank as noisy even
    where a few calm intervals measured less (one interval's jump waits for the next).
    ``spreads``: each point's spread of its own steps (``RankInterval.busy_cv``),
    aligned with ``points``; a regime's first point that spread far more than the
    rank's others straddled the change and is left out once later points measure
    the new speed (``STRADDLE_SPREAD``).
    """
    if not points:
        raise ValueError("fit_rank needs at least one point")
    measured = interval_noise(points)
    noise = measured if measured is not None else noise_prior
    noise = max(noise or 0.0, change_noise or 0.0)
    threshold = max(change_threshold, math.expm1(CHANGE_SIGMAS * noise))
    regime = find_regimes(points, threshold)
    n = len(points)
    noisy = (
        max(noise, step_noise or 0.0) >= CONFIRM_NOISE
        or len(regime.outliers) >= HEAVY_TAIL_OUTLIERS
    )
    pending = 0 < regime.start == n - 1 and noisy
    if pending:
        # Too noisy to call one interval a change: hold it back until the next confirms it.
        regime = Regime(regime.starts[:-1], (*regime.outliers, n - 1))
    straddled = _straddled(regime, spreads, n)
    if straddled:
        regime = Regime(regime.starts, tuple(sorted({*regime.outliers, *straddled})))
    current = regime.members(-1, n)
    fixed_s: float | None = None
    fixed_from = "none"
    for which in range(len(regime.starts) - 1, -1, -1):
        members = regime.members(which, n)
        fixed_s = _fixed_cost(points, members, fixed_recency, min_spread, noise)
        if fixed_s is not None:
            fixed_from = "regime" if which == len(regime.starts) - 1 else "earlier regime"
            break
        if which == len(regime.starts) - 1 and which > 0:
            fixed_s = _fixed_cost(
                points, members, fixed_recency, min_spread, noise, max_se=MAX_LEVELS_SE
            )
            if fixed_s is not None:
                fixed_from = "regime levels"
                break
    if fixed_s is None and prior_fixed_s is not None:
        fixed_s, fixed_from = prior_fixed_s, "prior"
    recent = current[-window:]
    n_target = (noise / LEVEL_TARGET) ** 2 if noise else 0.0
    if n_target > _n_eff([recency**k for k in range(len(recent))]):
        # Noisy: average over the whole regime, weights falling as an exponential
        # window of about n_target points ((1 + ρ)/(1 − ρ) effective points).
        recent = current
        recency = max(recency, (n_target - 1.0) / (n_target + 1.0))
    # c may not exceed most of the smallest recent time, or a would come out <= 0.
    ceiling = 0.9 * min(points[i][1] for i in recent)
    c = min(max(fixed_s or 0.0, 0.0), ceiling)
    values = [(points[i][1] - c) / points[i][0] for i in recent]
    weights = [recency ** (len(recent) - 1 - k) for k in range(len(recent))]
    a = max(huber_mean(values, weights), MIN_PER_SAMPLE_S)
    cv = robust_scale([v / a - 1.0 for v in values]) if len(values) >= 3 else None
    n_eff = _n_eff(weights)
    # Consecutive intervals measure the noise; until they can, the larger of the prior
    # (the steps' own spread) and the model's residuals (which also hold drift and a
    # wrong c) stands in.
    if measured is not None:
        noise = measured
    else:
        noise = max((v for v in (noise_prior, cv) if v is not None), default=None)
    if noise is None and len(regime.starts) > 1:
        noise = _values_cv(points, regime.members(-2, n)[-window:], c)
    batches = [points[i][0] for i in current]
    seen = (min(batches), max(batches))
    model = StepModel(a, c)
    rho = serial_correlation([points[i][1] / model.time(points[i][0]) - 1.0 for i in current])
    known = measured is not None or step_noise is not None or cv is not None
    return RankFit(
        model, regime, n, fixed_from, cv, n_eff, noise, seen, pending, rho, noise_measured=known
    )


def _straddled(regime: Regime, spreads: Sequence[float | None] | None, n: int) -> list[int]:
    """The regimes' first points (not the newest) whose steps spread by more than
    ``STRADDLE_SPREAD`` and ``STRADDLE_RATIO`` times the rank's median spread."""
    if spreads is None or len(spreads) != n:
        return []
    known = [v for v in spreads if v is not None]
    if not known:
        return []
    bar = max(STRADDLE_SPREAD, STRADDLE_RATIO * _median(known))
    return [k for k in regime.starts[1:] if k < n - 1 and (v := spreads[k]) is not None and v > bar]


def _n_eff(weights: Sequence[float]) -> float:
    """Effective number of points under ``weights``: ``(Σw)²/Σw²``."""
    return sum(weights) ** 2 / sum(w * w for w in weights) if weights else 0.0


def _values_cv(points: Sequence[Point], members: Sequence[int], c: float) -> float | None:
    """Relative spread of the per-sample values ``(t − c)/b`` of ``members`` (≥ 3 points)."""
    if len(members) < 3:
        return None
    values = [max(points[i][1] - c, MIN_PER_SAMPLE_S) / points[i][0] for i in members]
    mid = _median(values)
    return robust_scale([v / mid - 1.0 for v in values])


def _fixed_cost(
    points: Sequence[Point],
    members: Sequence[int],
    fixed_recency: float,
    min_spread: float,
    noise: float | None,
    *,
    max_se: float = MAX_FIXED_SE,
) -> float | None:
    """The fixed cost fitted over ``members``, or None where it is not known well enough:
    batches that barely differ, no measure of their noise (two points and no
    same-batch noise), or a standard error above ``max_se`` of the mean step
    time (see the module doc)."""
    if len(members) < 2 or (len(members) < 3 and noise is None):
        return None
    bs = [points[i][0] for i in members]
    mean_b = sum(bs) / len(bs)
    if mean_b <= 0 or (max(bs) - min(bs)) / mean_b < min_spread:
        return None
    weights = [fixed_recency ** (len(members) - 1 - k) for k in range(len(members))]
    a, c = huber_line([points[i] for i in members], weights)
    if a <= 0:
        return None  # a slope this wrong is noise or drift, not a measurement of c
    if _fixed_cost_se(points, members, a, c, noise) > max_se:
        return None
    return max(c, 0.0)


def _fixed_cost_se(
    points: Sequence[Point], members: Sequence[int], a: float, c: float, noise: float | None
) -> float:
    """Standard error of the intercept of ``t = a·b + c`` over ``members``, relative to
    their mean time: the least-squares ``s·√(1/n + b̄²/S_bb)``, with ``s`` the larger of
    the residuals' relative spread (RMS over ``n − 2`` degrees of freedom from 3
    points, a robust scale from 5) and the interval ``noise``."""
    n = len(members)
    bs = [float(points[i][0]) for i in members]
    ts = [points[i][1] for i in members]
    s = noise or 0.0
    if n >= 3:
        rel = [(t - (a * b + c)) / t for b, t in zip(bs, ts, strict=True)]
        # From 5 points a robust scale, so the outlier the Huber fit set aside (an
        # interval straddling a change) does not count as the line's noise.
        spread = robust_scale(rel) if n >= 5 else (sum(r * r for r in rel) / (n - 2)) ** 0.5
        s = max(s, spread)
    b_mean = sum(bs) / n
    s_bb = sum((b - b_mean) ** 2 for b in bs)
    se: float = s * (1.0 / n + b_mean * b_mean / s_bb) ** 0.5
    return se


def _theil_sen(bs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    slopes = [
        (ts[j] - ts[i]) / (bs[j] - bs[i])
        for i in range(len(bs))
        for j in range(i + 1, len(bs))
        if bs[j] != bs[i]
    ]
    if not slopes:
        return _weighted_line(bs, ts, [1.0] * len(bs))
    a = _median(slopes)
    return a, _median([t - a * b for b, t in zip(bs, ts, strict=True)])


def _huber_weight(residual: float, scale: float) -> float:
    r = abs(residual) / scale
    return 1.0 if r <= HUBER_DELTA else HUBER_DELTA / r


def _weighted_line(
    bs: Sequence[float], ts: Sequence[float], w: Sequence[float]
) -> tuple[float, float]:
    wsum = sum(w)
    b_mean = sum(wi * b for wi, b in zip(w, bs, strict=True)) / wsum
    t_mean = sum(wi * t for wi, t in zip(w, ts, strict=True)) / wsum
    var_b = sum(wi * (b - b_mean) ** 2 for wi, b in zip(w, bs, strict=True))
    if var_b <= 0:
        return (t_mean / b_mean if b_mean > 0 else 0.0), 0.0
    cov = sum(wi * (b - b_mean) * (t - t_mean) for wi, b, t in zip(w, bs, ts, strict=True))
    a = cov / var_b
    return a, t_mean - a * b_mean


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    pairs = sorted(zip(values, weights, strict=True))
    half = 0.5 * sum(weights)
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= half:
            return v
    return pairs[-1][0]
