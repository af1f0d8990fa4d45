"""Measurement-driven policies: ``dynamic`` (measurements only) and ``hybrid`` (with a prior).

Both fit ``t_i(b) = a_i·b + c_i`` per rank on its *work time* per step
(``RankInterval.work_s``: compute + optimizer, and the input wait where batches
are made on the training thread: the work a rank does between two gradient
synchronisations; ``robust_fit.fit_rank``: Huber fit, sudden-change detection,
fixed cost carried across changes) and solve for equal time. The optimizer step
lands in ``c_i``. Compute-only time alone would miss it: an AdamW step of an
86 M parameter model took 7.4 ms on a GPU shared with a neighbour against
2.7 ms on a free one, imbalance no compute-only fit can see.

A rank whose batches come from background workers (``RankInterval.input_s``)
also gets its pipeline's rate (``pipeline.py``): its time is the larger of its
work and its input, so an input-bound rank gets no more samples than its
workers make. The wait such a rank exposes stays out of the work fit: it is the
pipeline's rate showing, or its jitter, and neither says how fast the rank
computes (fitted as work, a pipeline that jittered made alike GPUs look 20%
apart and the plan wandered between [146, 110] and [112, 144]).

What to do with the fits (trust region, grid, order, warm shapes, confidence
test and pay-back) is ``moves.py``'s; whether the move did any good, measured
against the equal plan, is ``guard.py``'s (do no harm).

A decision fits twice: the newest ``history_window`` intervals (what is known
now) and the same number ending one interval earlier (what was known before the
newest: ``order.py``'s "before"). Given a longer history, the second is the
first of the previous decision, so fits are kept (:data:`KEPT_FITS`, by policy
and intervals; a fit is a pure function of both) and a decision in steady state
fits once: 1.2 of a report's 6 ms on the coordinator (8 ranks, a 2-core x86_64
box, Python 3.11).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hetero.core.balancer import guard
from hetero.core.balancer.changepoint import Point
from hetero.core.balancer.decision import Decision
from hetero.core.balancer.model import StepModel
from hetero.core.balancer.moves import MoveRules, decide
from hetero.core.balancer.order import SpeedOrder, Speeds
from hetero.core.balancer.payback import Horizon
from hetero.core.balancer.pipeline import with_input_rates
from hetero.core.balancer.plan import Batches, Constraints, equal_batches, round_to_plan
from hetero.core.balancer.robust_fit import RankFit, fit_rank
from hetero.core.balancer.shared_load import MIN_SHARED_RANKS, divide_load, load_factors
from hetero.core.balancer.stats import DeviceProfile, History, Interval, RankInterval
from hetero.core.errors import ConfigError, PlanError

#: Fits kept (the newest used): one per job a process decides for suffices to fit
#: each window once; a coordinator's report worker decides for every running job.
KEPT_FITS = 256


@dataclass(frozen=True)
class Dynamic:
    """Fit each rank's step time from recent intervals and solve for equal time.

    ``window``: newest intervals of a rank's current regime that set its
    per-sample cost, the newest weighing 1 and each older ``recency`` times
    less (follows drift). ``history_window``: intervals examined for speed
    changes and for the fixed cost, weighted ``fixed_recency`` per interval of
    age; the fixed cost needs batches that spread by ``min_spread`` (range over
    mean). ``change_threshold``: relative jump in a rank's time that no
    non-negative affine model explains, treated as a sudden change.
    ``dead_band``: smallest relative gain in predicted step time worth a new plan.

    How to move (``moves.py``): ``trust_factor``, how far beyond the batches a
    rank's regime has run its next batch may go (``trust.py``);
    ``confidence_z``, how many standard errors of the fits a gain must exceed,
    with ``default_cv`` the noise of one interval assumed before three
    intervals measure it; ``payback_intervals``, the rebalance intervals a gain
    is counted over against the switching cost, with ``switch_prior_steps``
    busy steps as the cost of a new batch size before one is measured
    (``payback.py``); ``grid``, the step of batch sizes (0: chosen per plan,
    1: none; ``grid.py``); ``recheck_steps``, the settled steps after a first
    move on a rank's new speed at which the caller asks again within the interval
    (``Decision.recheck_steps``; 0: never).
    """

    window: int = 8
    recency: float = 0.7
    dead_band: float = 0.01
    history_window: int = 32
    fixed_recency: float = 0.9
    min_spread: float = 0.05
    change_threshold: float = 0.15
    trust_factor: float = 2.0
    confidence_z: float = 1.5
    default_cv: float = 0.05
    payback_intervals: int = 10
    switch_prior_steps: float = 1.0
    grid: int = 0
    recheck_steps: int = 3
    name: str = "dynamic"

    def __post_init__(self) -> None:
        prefix = self.name
        if self.window < 1:
            raise ConfigError(f"{prefix}.window must be >= 1, got {self.window}")
        if self.history_window < self.window:
            raise ConfigError(
                f"{prefix}.history_window must be >= window ({self.window}), "
                f"got {self.history_window}"
            )
        for field_name in ("recency", "fixed_recency"):
            value = getattr(self, field_name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{prefix}.{field_name} must be in (0, 1], got {value}")
        if not 0.0 <= self.dead_band < 1.0:
            raise ConfigError(f"{prefix}.dead_band must be in [0, 1), got {self.dead_band}")
        if not 0.0 < self.min_spread < 1.0:
            raise ConfigError(f"{prefix}.min_spread must be in (0, 1), got {self.min_spread}")
        if not 0.0 < self.change_threshold <= 10.0:
            raise ConfigError(
                f"{prefix}.change_threshold must be in (0, 10], got {self.change_threshold}"
            )
        if not 1.0 < self.trust_factor <= 1000.0:
            raise ConfigError(
                f"{prefix}.trust_factor must be in (1, 1000], got {self.trust_factor}"
            )
        for field_name in ("confidence_z", "default_cv", "switch_prior_steps"):
            value = getattr(self, field_name)
            if not 0.0 <= value < math.inf:
                raise ConfigError(f"{prefix}.{field_name} must be finite and >= 0, got {value}")
        if self.payback_intervals < 0:
            raise ConfigError(
                f"{prefix}.payback_intervals must be >= 0, got {self.payback_intervals}"
            )
        if self.recheck_steps < 0:
            raise ConfigError(
                f"{prefix}.recheck_steps must be >= 0 (0: never), got {self.recheck_steps}"
            )
        if self.grid < 0:
            raise ConfigError(f"{prefix}.grid must be >= 0 (0: automatic), got {self.grid}")

    @property
    def rules(self) -> MoveRules:
        return MoveRules(
            dead_band=self.dead_band,
            trust_factor=self.trust_factor,
            confidence_z=self.confidence_z,
            default_cv=self.default_cv,
            payback_intervals=self.payback_intervals,
            switch_prior_steps=self.switch_prior_steps,
            grid=self.grid,
            recheck_steps=self.recheck_steps,
        )

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches:
        return equal_batches(constraints)

    def fit_ranks(self, history: History) -> tuple[RankFit, ...]:
        """One fit per rank of its busy time, from the newest intervals that have the
        newest world size, with the load all ranks share divided out (``shared_load``,
        from three ranks on). Kept: the same policy and intervals are fitted once."""
        recent = tuple(tuple(iv) for iv in _same_world_tail(history, self.history_window))
        return _kept_fit(self, recent)

    def _fit_ranks(self, recent: tuple[Interval, ...]) -> tuple[RankFit, ...]:
        world = len(recent[-1])
        grid = [[(ri.batch, ri.work_s) if _fitted(ri) else None for ri in iv] for iv in recent]
        first = self._fit_grid(grid, recent)
        if world < MIN_SHARED_RANKS:
            return with_input_rates(first, recent, self.window, self.default_cv)
        factors = load_factors(grid, [f.model for f in first])
        raw_noise = [f.noise_cv for f in first]
        fits = self._fit_grid(divide_load(grid, factors), recent, raw_noise)
        # Dividing by the median rank's times smooths that rank's series most: no rank's
        # relative noise counts as less than the ranks' typical one.
        noises = sorted(f.noise_cv for f in fits if f.noise_cv is not None)
        if noises:
            typical = noises[len(noises) // 2]
            measured = any(f.noise_measured for f in fits)
            fits = tuple(
                replace(f, noise_cv=max(f.noise_cv or 0.0, typical), noise_measured=measured)
                for f in fits
            )
        return with_input_rates(fits, recent, self.window, self.default_cv)

    def _fit_grid(
        self,
        grid: Sequence[Sequence[Point | None]],
        recent: Sequence[Interval],
        change_noise: Sequence[float | None] | None = None,
    ) -> tuple[RankFit, ...]:
        fits: list[RankFit | None] = []
        for rank in range(len(grid[-1])):
            points = [p for row in grid if (p := row[rank]) is not None]
            spreads = [
                iv[rank].busy_cv
                for row, iv in zip(grid, recent, strict=True)
                if row[rank] is not None
            ]
            optimizer = sorted(
                o for iv in recent if iv[rank].steps > 0 and (o := iv[rank].optimizer_s) is not None
            )
            floors = sorted(
                f for iv in recent if iv[rank].steps > 0 and (f := iv[rank].noise_floor) is not None
            )
            fits.append(
                fit_rank(
                    points,
                    # The optimizer step is a fixed cost by definition: the floor of c
                    # where the batches have not spread enough to measure it.
                    prior_fixed_s=optimizer[len(optimizer) // 2] if optimizer else None,
                    window=self.window,
                    recency=self.recency,
                    fixed_recency=self.fixed_recency,
                    min_spread=self.min_spread,
                    change_threshold=self.change_threshold,
                    # Until consecutive intervals measure the noise: the spread of the
                    # intervals' own steps, else the configured guess.
                    noise_prior=floors[len(floors) // 2] if floors else self.default_cv,
                    change_noise=change_noise[rank] if change_noise else None,
                    step_noise=floors[len(floors) // 2] if floors else None,
                    spreads=spreads,
                )
                if points
                else None
            )
        return _fill_unmeasured(fits)

    def fit(self, history: History) -> tuple[StepModel, ...]:
        """One step-time model per rank from the recent history."""
        return tuple(f.model for f in self.fit_ranks(history))

    def models(
        self, history: History, profiles: Sequence[DeviceProfile] | None
    ) -> tuple[tuple[StepModel, ...], tuple[RankFit, ...]]:
        """The models the plan is solved on (``hybrid`` blends in its prior here)."""
        fits = self.fit_ranks(history)
        return tuple(f.model for f in fits), fits

    def order(
        self,
        history: History,
        profiles: Sequence[DeviceProfile] | None,
        now: Speeds | None = None,
    ) -> SpeedOrder:
        """What is known of the ranks' speeds with the newest interval and before it
        (``order.py``: one noisy interval inverts nothing); ``now``, the first where the
        caller fitted ``history`` already (a fit is most of a decision's cost)."""
        if now is None:
            now = self._known(history, profiles)
        return SpeedOrder(now, self._known(history[:-1], profiles), self.confidence_z)

    def _known(self, history: History, profiles: Sequence[DeviceProfile] | None) -> Speeds | None:
        if not history:
            return None
        try:
            models, fits = self.models(history, profiles)
        except PlanError:
            return None
        return Speeds.of(models, fits, self.default_cv)

    def next_plan(
        self,
        history: History,
        current: Batches,
        constraints: Constraints,
        profiles: Sequence[DeviceProfile] | None = None,
        horizon: Horizon | None = None,
    ) -> Decision:
        if not history or len(history[-1]) != constraints.world_size:
            return Decision(tuple(current), False, "no measurements for this world size yet")
        try:
            models, fits = self.models(history, profiles)
        except PlanError as exc:
            return Decision(tuple(current), False, f"keeping the plan: {exc}")
        order = self.order(history, profiles, Speeds.of(models, fits, self.default_cv))
        if order.before is not None and len(history[-2]) != len(history[-1]):
            order = SpeedOrder(order.now, None, order.z)  # a restart: the old ranks are others
        decision = decide(
            history, tuple(current), constraints, models, fits, order, self.rules, horizon
        )
        recent = _same_world_tail(history, self.history_window)
        return guard.guarded(
            decision,
            recent[_regime_start(recent, fits) :],
            tuple(current),
            constraints,
            models,
            fits,
            self.rules,
        )


@dataclass(frozen=True)
class Hybrid(Dynamic):
    """``dynamic`` with a hardware prior that gives way to measurements as they accumulate.

    Starts from the proportional-to-compute-score split. Then each rank's
    per-sample cost is the precision-weighted mean, in log space, of the
    measured value and the prior: the prior says a rank's speed relative to the
    others is its compute score's, give or take ``prior_cv`` (relative, one
    standard deviation); the measurement is known to ``cv/√n_eff`` from the
    spread of its recent intervals (``measurement_cv`` while fewer than three
    give a spread). A few clean intervals outweigh the prior; noisy or scarce
    ones lean on it. The prior sets only *relative* speed (its scale is the
    measurements' geometric mean), and fixed costs are always measured.
    Without usable profiles it is ``dynamic`` with the proportional start.
    """

    prior_cv: float = 0.25
    measurement_cv: float = 0.05
    name: str = "hybrid"

    def __post_init__(self) -> None:
        super().__post_init__()
        for field_name in ("prior_cv", "measurement_cv"):
            value = getattr(self, field_name)
            if not 0.0 < value < math.inf:
                raise ConfigError(f"hybrid.{field_name} must be finite and > 0, got {value}")

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches:
        speeds = _speeds(profiles, constraints.world_size)
        return round_to_plan(speeds, constraints) if speeds else equal_batches(constraints)

    def models(
        self, history: History, profiles: Sequence[DeviceProfile] | None
    ) -> tuple[tuple[StepModel, ...], tuple[RankFit, ...]]:
        fits = self.fit_ranks(history)
        speeds = _speeds(profiles, len(fits))
        if not speeds:
            return tuple(f.model for f in fits), fits
        # The prior's scale: geometric mean of a_i·speed_i, so the prior only
        # says how ranks compare, never how fast the job is.
        logs = [math.log(f.model.per_sample_s * s) for f, s in zip(fits, speeds, strict=True)]
        scale = sum(logs) / len(logs)
        prior_var = self.prior_cv**2
        blended = []
        for f, s in zip(fits, speeds, strict=True):
            cv = f.per_sample_cv if f.per_sample_cv is not None else self.measurement_cv
            measured_var = max(cv, 1e-4) ** 2 / f.n_eff
            w = prior_var / (prior_var + measured_var)
            log_a = w * math.log(f.model.per_sample_s) + (1.0 - w) * (scale - math.log(s))
            blended.append(StepModel(math.exp(log_a), f.model.fixed_s, f.model.input_per_sample_s))
        return tuple(blended), fits


def _speeds(profiles: Sequence[DeviceProfile] | None, world: int) -> list[float]:
    """Relative speeds from profiles, or [] when they cannot serve as a prior."""
    if not profiles or len(profiles) != world:
        return []
    speeds = [p.compute_score for p in profiles]
    if not all(math.isfinite(s) and s > 0 for s in speeds):
        return []
    return speeds


@functools.lru_cache(maxsize=KEPT_FITS)
def _kept_fit(policy: Dynamic, recent: tuple[Interval, ...]) -> tuple[RankFit, ...]:
    return policy._fit_ranks(recent)


def _regime_start(recent: Sequence[Interval], fits: Sequence[RankFit]) -> int:
    """Index in ``recent`` of the first interval of the job's current speed regime: the
    newest interval at which any rank's fitted regime began (``changepoint``)."""
    start = 0
    for rank, fit in enumerate(fits):
        measured = [k for k, iv in enumerate(recent) if _fitted(iv[rank])]
        if 0 <= fit.regime.start < len(measured):
            start = max(start, measured[fit.regime.start])
    return start


def _fitted(ri: RankInterval) -> bool:
    """Whether an interval is one of its rank's fitted points (``Dynamic._fit_ranks``)."""
    return ri.steps > 0 and ri.batch > 0 and ri.work_s > 0


def _same_world_tail(history: History, limit: int) -> list[Interval]:
    """The newest ``limit`` intervals, stopping at a change of world size (a restart)."""
    world = len(history[-1])
    out: list[Interval] = []
    for iv in reversed(history):
        if len(iv) != world or len(out) >= limit:
            break
        out.append(iv)
    out.reverse()
    return out


def _fill_unmeasured(fits: Sequence[RankFit | None]) -> tuple[RankFit, ...]:
    """Give a rank with no usable interval the median model of the measured ranks."""
    measured = [f for f in fits if f is not None]
    if len(measured) == len(fits):
        return tuple(measured)
    if not measured:
        raise PlanError("no rank has a measured interval to fit")
    by_a = sorted(measured, key=lambda f: f.model.per_sample_s)
    typical = by_a[len(by_a) // 2]
    return tuple(f if f is not None else typical for f in fits)
