"""Per-rank step-time model ``t(b) = max(a·b + c, r·b)`` and the equal-time solve.

``a`` is seconds per sample, ``c`` the fixed cost of a step (kernel launches,
Python overhead, optimizer-independent work). A split proportional to
throughput is right only when every ``c ≈ 0``; the equal-time solve is right
for any ``c``.

``r`` is the seconds per sample of the rank's background input pipeline (its
DataLoader workers, ``RankInterval.input_s``), 0 where batches are made on the
training thread (their time is then part of ``a·b + c``). The pipeline runs
beside the step, so it costs nothing while it keeps up and sets the step once
it does not: a rank given more samples than its workers can make per step waits
for them however fast it computes. Moving samples from a rank of a node to
another adds no decoding throughput to the node; with each rank's own workers
fixed, each rank's ``r`` is its share of that throughput, and the solve plans
to the lower of compute and input per rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.grid import grid_round
from hetero.core.balancer.plan import Batches, Box, Constraints, largest_remainder


@dataclass(frozen=True)
class StepModel:
    """``t(b) = max(per_sample_s · b + fixed_s, input_per_sample_s · b)`` in seconds."""

    per_sample_s: float
    fixed_s: float = 0.0
    input_per_sample_s: float = 0.0

    def time(self, batch: float) -> float:
        return max(self.work(batch), self.input_per_sample_s * batch)

    def work(self, batch: float) -> float:
        """Seconds of the rank's own work at ``batch`` (compute, optimizer, serial input)."""
        return self.per_sample_s * batch + self.fixed_s

    def input_bound(self, batch: float) -> bool:
        """Whether the input pipeline, not the rank's work, sets its step at ``batch``."""
        return self.input_per_sample_s * batch > self.work(batch)

    def largest_batch(self, step_s: float) -> float:
        """The largest (real) batch whose predicted time is at most ``step_s``."""
        b = max(step_s - self.fixed_s, 0.0) / self.per_sample_s
        if self.input_per_sample_s > 0:
            b = min(b, step_s / self.input_per_sample_s)
        return b


def fit_step_model(
    points: Sequence[tuple[int, float]],
    *,
    recency: float = 0.7,
    min_spread: float = 0.05,
) -> StepModel:
    """Weighted least-squares fit of ``t = a·b + c`` to ``(batch, seconds)`` points.

    Points are oldest first; the newest weighs 1, each older one ``recency`` times
    less, so the model follows drift. With too little spread in ``b`` (all
    points at about one batch size) the fixed cost cannot be identified and the
    fit passes through the origin: ``a = t/b``, ``c = 0``. Iterating that
    proportional split still converges to equal time, and each new plan adds a
    point with a new ``b``. A fit with negative ``a`` or ``c`` (noise) falls back
    the same way.
    """
    if not points:
        raise ValueError("fit_step_model needs at least one point")
    n = len(points)
    weights = [recency ** (n - 1 - k) for k in range(n)]
    wsum = sum(weights)
    bs = [float(b) for b, _ in points]
    ts = [float(t) for _, t in points]
    b_mean = sum(w * b for w, b in zip(weights, bs, strict=True)) / wsum
    t_mean = sum(w * t for w, t in zip(weights, ts, strict=True)) / wsum
    var_b = sum(w * (b - b_mean) ** 2 for w, b in zip(weights, bs, strict=True)) / wsum
    if b_mean > 0 and math.sqrt(var_b) / b_mean >= min_spread:
        cov = (
            sum(w * (b - b_mean) * (t - t_mean) for w, b, t in zip(weights, bs, ts, strict=True))
            / wsum
        )
        a = cov / var_b
        c = t_mean - a * b_mean
        if a > 0 and c >= 0:
            return StepModel(a, c)
        # A negative slope or fixed cost is noise: fall through to the origin fit.
    # Through the origin, weighted: a = Σw·t·b / Σw·b².
    num = sum(w * t * b for w, b, t in zip(weights, bs, ts, strict=True))
    den = sum(w * b * b for w, b in zip(weights, bs, strict=True))
    return StepModel(max(num / den, 1e-12) if den > 0 else 1e-12, 0.0)


def predict_step_s(
    models: Sequence[StepModel], batches: Sequence[int], *, comm_s: float = 0.0
) -> float:
    """Predicted step time of a plan in seconds: the slowest rank's compute plus ``comm_s``.

    With the default ``comm_s = 0`` this is the compute-only step time.
    """
    return max(m.time(b) for m, b in zip(models, batches, strict=True)) + comm_s


def equal_time_plan(
    models: Sequence[StepModel], constraints: Constraints, box: Box | None = None, grid: int = 1
) -> Batches:
    """The integer plan that makes every rank's predicted step time equal.

    Solves ``t_i(b_i) = T`` for all i with ``Σ b_i = B``, each ``b_i`` within its
    bounds (``box``, default ``[min_batch, cap]``; a rank at a bound takes a time
    below ``T``), then rounds to integers summing to B, on multiples of ``grid``
    where the box allows (``grid.grid_round``). Affine models have the closed form
    ``T = (B + Σ c_i/a_i) / Σ 1/a_i``, ``b_i = (T − c_i)/a_i``, with ranks pushed
    outside their bounds pinned and the rest re-solved; with an input pipeline's
    rate in a model, ``t_i`` is a maximum of two lines and ``T`` is found by
    bisection on the (monotone) total of the batches each rank can take within it.
    """
    box = box or Box.of(constraints)
    if any(m.input_per_sample_s > 0 for m in models):
        targets = _bisected_targets(models, constraints, box)
    else:
        targets = _affine_targets(models, constraints, box)
    return _best_rounding(targets, models, constraints, box, grid)


def _affine_targets(models: Sequence[StepModel], constraints: Constraints, box: Box) -> list[float]:
    world = constraints.world_size
    pinned: dict[int, float] = {}
    while True:
        free = [i for i in range(world) if i not in pinned]
        remaining = constraints.global_batch - sum(pinned.values())
        if not free:
            return [pinned[i] for i in range(world)]
        inv = sum(1.0 / models[i].per_sample_s for i in free)
        t_eq = (remaining + sum(models[i].fixed_s / models[i].per_sample_s for i in free)) / inv
        share = {i: (t_eq - models[i].fixed_s) / models[i].per_sample_s for i in free}
        violated: dict[int, float] = {}
        for i in free:
            if share[i] < box.lower[i]:
                violated[i] = float(box.lower[i])
            elif share[i] > box.upper[i]:
                violated[i] = float(box.upper[i])
        if not violated:
            return [pinned.get(i, share.get(i, 0.0)) for i in range(world)]
        pinned.update(violated)


#: Bisection steps of the equal-time solve: the interval shrinks 2^-100, far below any
#: batch's worth of time.
_BISECTIONS = 100


def _bisected_targets(
    models: Sequence[StepModel], constraints: Constraints, box: Box
) -> list[float]:
    def batches(step_s: float) -> list[float]:
        return [
            min(max(m.largest_batch(step_s), lo), hi)
            for m, lo, hi in zip(models, box.lower, box.upper, strict=True)
        ]

    total = float(constraints.global_batch)
    low, high = 0.0, max(m.time(hi) for m, hi in zip(models, box.upper, strict=True))
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low + high)
        if sum(batches(mid)) < total:
            low = mid
        else:
            high = mid
    # Between ``low`` (too few) and ``high`` (enough): the ranks that can still grow
    # between the two take the difference in proportion to how much they grow.
    under, over = batches(low), batches(high)
    short = total - sum(under)
    room = sum(o - u for u, o in zip(under, over, strict=True))
    if room <= 0:
        return over
    return [u + short * (o - u) / room for u, o in zip(under, over, strict=True)]


def _best_rounding(
    targets: Sequence[float],
    models: Sequence[StepModel],
    constraints: Constraints,
    box: Box,
    grid: int,
) -> Batches:
    """Largest-remainder rounding (on the grid if it fits the box), then move single
    grid steps off the slowest rank while that lowers the predicted step time
    (rounding can matter at small B)."""
    on_grid = grid_round(targets, constraints, box, grid) if grid > 1 else None
    g = grid if on_grid is not None else 1
    plan = list(on_grid if on_grid is not None else largest_remainder(targets, constraints, box))
    for _ in range(constraints.world_size * 4):
        times = [m.time(b) for m, b in zip(models, plan, strict=True)]
        slow = max(range(len(plan)), key=lambda i: times[i])
        fast = min(
            (i for i in range(len(plan)) if plan[i] + g <= box.upper[i]),
            key=lambda i: models[i].time(plan[i] + g),
            default=None,
        )
        if fast is None or fast == slow or plan[slow] - g < box.lower[slow]:
            break
        if models[fast].time(plan[fast] + g) >= times[slow]:
            break
        plan[slow] -= g
        plan[fast] += g
    return _faster_gets_more(plan, models, box)


def _faster_gets_more(plan: list[int], models: Sequence[StepModel], box: Box) -> Batches:
    """Among ranks with the same fixed cost (and input rate), hand the larger batches to
    the faster ranks.

    Rounding breaks near-ties by rank order, which can give a rank that is
    slower by a rounding error one sample more than a faster one. Swapping
    such pairs keeps the sum and the predicted step time (the pair's times
    only move toward each other) and makes the plan monotone in speed.
    """
    out = list(plan)
    swapped = True
    while swapped:  # each swap removes at least one inversion: at most W² rounds
        swapped = False
        for i in range(len(out)):
            for j in range(len(out)):
                faster = models[i].per_sample_s < models[j].per_sample_s
                same_fixed = (
                    models[i].fixed_s == models[j].fixed_s
                    and models[i].input_per_sample_s == models[j].input_per_sample_s
                )
                fits = out[j] <= box.upper[i] and out[i] >= box.lower[j]
                if faster and same_fixed and out[i] < out[j] and fits:
                    out[i], out[j] = out[j], out[i]
                    swapped = True
    return tuple(out)
