"""Whether a plan change pays for itself: a confident gain, worth more than the switch.

A new plan is worth adopting only when two things hold.

**The gain is real** (a confidence test). Each rank's fitted time is known to
about ``σ_i = noise_i / √m_i`` (relative): the noise of one interval,
``RankFit.noise_cv``, over the number of independent intervals behind the fit
(below). The predicted gain is the difference of two predicted step times, set
by the slowest rank under the current plan and by any rank under the new one
(an equal-time plan makes them all about as slow), so it must exceed
``z · √(σ_now² + σ_new²)`` of the current step time (and the fixed
dead-band), ``σ_new`` the largest error among the ranks. On GPUs with 1% noise
that is about the dead-band; on a loaded CPU box, where intervals swing by 20%
or more, only moves larger than the noise pass, so the plan settles instead of
chasing it.

**Independent intervals.** Independent intervals give ``m = n_eff``, their
effective number under the fit's recency weights. Intervals whose level
wanders give less, and the noise does not show it: it is read from
consecutive intervals (``noise.py``), which a slow wander moves alike. Where
consecutive deviations correlate by ``ρ`` (an AR(1) series), their
differences hold ``1 − ρ`` of their variance and a mean of ``n`` of them has
the variance of ``n·(1 − ρ)/(1 + ρ)`` independent ones; put in terms of the
measured noise, ``m = n_eff·(1 − ρ)²/(1 + ρ)``, and at least one interval.
``ρ`` is ``RankFit.serial_corr``, read over the rank's current regime (0
until it holds ``noise.SERIAL_POINTS`` intervals). Counting every interval as
independent let the plan chase a wander: on a 2-core CPU box running three
ranks (global batch 96), the rank with the most samples went from 0.98-1.01 ms
per sample at 59-62 samples to 1.20-1.35 ms at 62-63 as the run went on, and
back to about 1.0 ms each time the plan gave it 59; with ``m = n_eff`` (5.7)
the thresholds were 2.4-4.4% and the plan moved four times in the run's
settled half. A true change of speed is not held back: it starts a new
regime, whose first intervals are too few for ``ρ``.

**The gain pays for the switch.** Every rank whose batch changes spends its
first steps at the new size on new shapes (``RankInterval.switch_s``, measured
by the trainer); the ranks warm up side by side, so the job pays about the
largest of their costs. A change is made only if ``gain per step × steps it
will run`` exceeds that cost, where the steps are ``payback_intervals``
rebalance intervals, fewer if the job ends sooner (``Horizon``). A shape the
rank ran recently (warm) costs what its warm switches cost; unmeasured costs
fall back to a prior of ``prior_steps`` busy steps for a new shape and a fifth
of that for a warm one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.model import StepModel
from hetero.core.balancer.robust_fit import RankFit
from hetero.core.balancer.stats import History

#: A warm shape's switching cost over a new shape's, where no warm switch was measured.
WARM_SHARE = 0.2
#: Share of a rank's work time from which its input pipeline's time counts as (nearly)
#: setting its step, and its rate's error as its prediction's (``sigma_at``).
INPUT_NEAR = 0.8


@dataclass(frozen=True)
class Horizon:
    """How long a new plan will run: ``interval_steps`` per rebalance interval and, if
    the job's length is known, ``steps_left`` until it ends."""

    interval_steps: int
    steps_left: int | None = None

    def steps(self, intervals: int) -> int:
        """Steps a plan adopted now runs in the next ``intervals`` intervals (or to the end)."""
        planned = intervals * self.interval_steps
        return planned if self.steps_left is None else max(min(planned, self.steps_left), 0)


@dataclass(frozen=True)
class SwitchCosts:
    """Per rank, seconds a change to a new (``cold``) or recently run (``warm``) batch
    size costs in all; ``measured`` says whether any came from the trainer."""

    cold: tuple[float, ...]
    warm: tuple[float, ...]
    measured: bool

    def of(
        self, current: Sequence[int], plan: Sequence[int], shapes: Sequence[frozenset[int]]
    ) -> float:
        """What changing from ``current`` to ``plan`` costs the job, seconds: the largest
        cost among the ranks whose batch changes."""
        cost = 0.0
        for r, (old, new) in enumerate(zip(current, plan, strict=True)):
            if old != new:
                warm = r < len(shapes) and new in shapes[r]
                cost = max(cost, self.warm[r] if warm else self.cold[r])
        return cost


def switch_costs(history: History, busy_s: Sequence[float], *, prior_steps: float) -> SwitchCosts:
    """Each rank's switching costs from the measured ``switch_s`` in ``history``: median
    of its cold (a size it had not run earlier in ``history``) and of its warm switches.
    A rank's first interval in ``history`` measured what its first batch size cost
    (process warm-up included): that stands in for a cold switch only until a real one
    is measured, the rank's or the job's. A rank with neither takes the prior:
    ``prior_steps`` of its busy step time ``busy_s`` (seconds) for a new size,
    ``WARM_SHARE`` of it for a warm one. On 2x H200 ResNet-50's first size cost 1.8 s
    and its first real switch 0.3 s: the median of the two kept moves that paid back
    in 100 steps from being made."""
    world = len(busy_s)
    cold: list[list[float]] = [[] for _ in range(world)]
    first: list[list[float]] = [[] for _ in range(world)]
    warm: list[list[float]] = [[] for _ in range(world)]
    ran: list[set[int]] = [set() for _ in range(world)]
    for iv in history:
        if len(iv) != world:
            continue
        for r, ri in enumerate(iv):
            if ri.switch_s is not None and math.isfinite(ri.switch_s) and ri.switch_s >= 0:
                kind = warm if ri.batch in ran[r] else cold if ran[r] else first
                kind[r].append(ri.switch_s)
            if ri.steps > 0:
                ran[r].add(ri.batch)
    all_cold = [v for vs in cold for v in vs]
    all_first = [v for vs in first for v in vs]
    all_warm = [v for vs in warm for v in vs]
    out_cold, out_warm = [], []
    for r in range(world):
        c = _first(
            _median(cold[r]),
            _median(all_cold),
            _median(first[r]),
            _median(all_first),
            prior_steps * busy_s[r],
        )
        w = min(_first(_median(warm[r]), _median(all_warm), WARM_SHARE * c), c)
        out_cold.append(c)
        out_warm.append(w)
    measured = bool(all_cold or all_warm or all_first)
    return SwitchCosts(tuple(out_cold), tuple(out_warm), measured)


def level_sigma(fit: RankFit, default_cv: float) -> float:
    """Relative standard error of a rank's fitted time where it runs: noise / √m, with
    ``m = n_eff·(1 − ρ)²/(1 + ρ)`` independent intervals, at least one (module doc)."""
    noise = fit.noise_cv if fit.noise_cv is not None else default_cv
    rho = fit.serial_corr
    independent = fit.n_eff * (1.0 - rho) ** 2 / (1.0 + rho)
    return max(noise, 0.0) / math.sqrt(max(independent, 1.0))


def sigma_at(fit: RankFit, model: StepModel, batch: float, default_cv: float) -> float:
    """Relative standard error of a rank's predicted time at ``batch``: its fit's
    (``level_sigma``), or its input rate's where the input pipeline sets (or within
    ``INPUT_NEAR`` of setting) the step there, whichever is larger."""
    sigma = level_sigma(fit, default_cv)
    if model.input_per_sample_s * batch >= INPUT_NEAR * model.work(batch):
        sigma = max(sigma, fit.input_sigma)
    return sigma


def gain_threshold(
    models: Sequence[StepModel],
    fits: Sequence[RankFit],
    current: Sequence[int],
    proposed: Sequence[int],
    *,
    z: float,
    default_cv: float,
) -> float:
    """Smallest relative gain that is not noise: ``z·√(σ_now² + σ_new²)``. ``σ_now`` is
    the error of the rank that sets the step under ``current``; under ``proposed``
    every rank is about as slow as the step, so any of them may set it, and
    ``σ_new`` is the largest of their errors (weighted by how close each comes to
    the step): a rank whose one new interval says it got faster is believed only
    as far as that one interval's noise allows."""
    slow_now = max(range(len(models)), key=lambda i: models[i].time(current[i]))
    s_now = sigma_at(fits[slow_now], models[slow_now], current[slow_now], default_cv)
    times = [m.time(b) for m, b in zip(models, proposed, strict=True)]
    step = max(times)
    s_new = (
        max(
            sigma_at(f, m, b, default_cv) * t / step
            for f, m, b, t in zip(fits, models, proposed, times, strict=True)
        )
        if step > 0
        else 0.0
    )
    return z * math.hypot(s_now, s_new)


def _first(*values: float | None) -> float:
    """The first value that is not None (the last one never is)."""
    for v in values:
        if v is not None:
            return v
    return 0.0


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
