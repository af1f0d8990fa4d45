"""Robust per-rank fit of ``t(b) = a·b + c`` from interval points.

Each rebalance interval gives one point per rank: its batch and its mean
compute-only seconds per step. Three things make a plain least-squares fit
over the last few points wrong in practice, and each has a remedy here:

* **Outliers** (a checkpoint save inside an interval, a GC pause): Huber
  M-estimation by iteratively reweighted least squares, on relative residuals
  because step-time noise is multiplicative. Points the change detector calls
  outliers are dropped before fitting.
* **Sudden changes** (a neighbour arrives): only the current regime's points
  are fitted (``changepoint.find_regimes``).
* **Too little spread in b to identify c.** Once a plan has converged every
  point sits at one batch size and the fixed cost ``c`` is unidentifiable. It
  is estimated from the regime's whole history (old points, from before the
  plan converged, have the spread), else carried over from the previous
  regime (a neighbour mostly slows the per-sample work, not kernel launches),
  else taken from a prior, else 0. The per-sample cost ``a`` is then a
  recency-weighted Huber mean of ``(t − c)/b`` over the newest points, so the
  model always passes through where the rank runs now and follows drift.
  A wrong ``c`` only mis-sizes the next move, never the fixed point: when the
  fitted times at the current plan are equal, the equal-time solve returns the
  current plan whatever the slopes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.changepoint import Point, Regime, find_regimes
from hetero.core.balancer.model import StepModel

#: Huber's tuning constant: 95% efficiency under Gaussian noise.
HUBER_DELTA = 1.345
#: Robust scale floor (relative): noise-free data must not make every residual an outlier.
MIN_SCALE = 1e-3
#: Smallest per-sample cost a fit may return, seconds; keeps the equal-time solve finite.
MIN_PER_SAMPLE_S = 1e-12


@dataclass(frozen=True)
class RankFit:
    """One rank's fitted model and where its data came from.

    ``regime`` indexes into the points that were fitted; ``fixed_from`` says
    which evidence set ``fixed_s``: ``"regime"``, ``"earlier regime"``,
    ``"prior"`` or ``"none"`` (then ``fixed_s = 0``). ``per_sample_cv`` is the
    robust relative spread of the per-sample values behind ``per_sample_s``
    (``None`` from fewer than three points) and ``n_eff`` their effective
    number under the recency weights, ``(Σw)²/Σw²``: together they say how
    well ``per_sample_s`` is known.
    """

    model: StepModel
    regime: Regime
    n_points: int
    fixed_from: str
    per_sample_cv: float | None = None
    n_eff: float = 1.0

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
) -> RankFit:
    """Fit one rank's step model from its points, oldest first (see the module doc).

    ``window`` newest points of the current regime set the per-sample cost,
    the newest weighing 1 and each older ``recency`` times less; the fixed cost
    comes from the whole regime weighted by ``fixed_recency`` per point of age,
    if the regime's batches spread by at least ``min_spread`` (range over mean).
    """
    if not points:
        raise ValueError("fit_rank needs at least one point")
    regime = find_regimes(points, change_threshold)
    n = len(points)
    current = regime.members(-1, n)
    fixed_s: float | None = None
    fixed_from = "none"
    for which in range(len(regime.starts) - 1, -1, -1):
        fixed_s = _fixed_cost(points, regime.members(which, n), fixed_recency, min_spread)
        if fixed_s is not None:
            fixed_from = "regime" if which == len(regime.starts) - 1 else "earlier regime"
            break
    if fixed_s is None and prior_fixed_s is not None:
        fixed_s, fixed_from = prior_fixed_s, "prior"
    recent = current[-window:]
    # c may not exceed most of the smallest recent time, or a would come out <= 0.
    ceiling = 0.9 * min(points[i][1] for i in recent)
    c = min(max(fixed_s or 0.0, 0.0), ceiling)
    values = [(points[i][1] - c) / points[i][0] for i in recent]
    weights = [recency ** (len(recent) - 1 - k) for k in range(len(recent))]
    a = max(huber_mean(values, weights), MIN_PER_SAMPLE_S)
    cv = robust_scale([v / a - 1.0 for v in values]) if len(values) >= 3 else None
    n_eff = sum(weights) ** 2 / sum(w * w for w in weights)
    return RankFit(StepModel(a, c), regime, n, fixed_from, cv, n_eff)


def _fixed_cost(
    points: Sequence[Point], members: Sequence[int], fixed_recency: float, min_spread: float
) -> float | None:
    """The fixed cost fitted over ``members``, or None if their batches barely differ."""
    if len(members) < 2:
        return None
    bs = [points[i][0] for i in members]
    mean_b = sum(bs) / len(bs)
    if mean_b <= 0 or (max(bs) - min(bs)) / mean_b < min_spread:
        return None
    weights = [fixed_recency ** (len(members) - 1 - k) for k in range(len(members))]
    a, c = huber_line([points[i] for i in members], weights)
    if a <= 0:
        return None  # a slope this wrong is noise or drift, not a measurement of c
    return max(c, 0.0)


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
