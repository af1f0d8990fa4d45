"""Measurement-driven policies: ``dynamic`` (measurements only) and ``hybrid`` (with a prior).

Both fit ``t_i(b) = a_i·b + c_i`` per rank (``robust_fit.fit_rank``: Huber fit,
sudden-change detection, fixed cost carried across changes) and solve for equal
compute time (``model.equal_time_plan``: clamps to ``[min_batch, cap]`` and
re-solves, integer plan summing to B). A new plan is adopted only when it lowers
the predicted step time by more than ``dead_band``, so interval-to-interval
noise does not move samples back and forth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.decision import Decision
from hetero.core.balancer.model import StepModel, equal_time_plan, predict_step_s
from hetero.core.balancer.plan import Batches, Constraints, equal_batches, round_to_plan
from hetero.core.balancer.robust_fit import RankFit, fit_rank
from hetero.core.balancer.stats import DeviceProfile, History, Interval
from hetero.core.errors import ConfigError, PlanError


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
    """

    window: int = 8
    recency: float = 0.7
    dead_band: float = 0.01
    history_window: int = 32
    fixed_recency: float = 0.9
    min_spread: float = 0.05
    change_threshold: float = 0.15
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

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches:
        return equal_batches(constraints)

    def fit_ranks(self, history: History) -> tuple[RankFit, ...]:
        """One fit per rank from the newest intervals that have the newest world size."""
        recent = _same_world_tail(history, self.history_window)
        world = len(recent[-1])
        fits: list[RankFit | None] = []
        for rank in range(world):
            points = [
                (iv[rank].batch, iv[rank].compute_s)
                for iv in recent
                if iv[rank].steps > 0 and iv[rank].batch > 0 and iv[rank].compute_s > 0
            ]
            fits.append(
                fit_rank(
                    points,
                    window=self.window,
                    recency=self.recency,
                    fixed_recency=self.fixed_recency,
                    min_spread=self.min_spread,
                    change_threshold=self.change_threshold,
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

    def next_plan(
        self,
        history: History,
        current: Batches,
        constraints: Constraints,
        profiles: Sequence[DeviceProfile] | None = None,
    ) -> Decision:
        if not history or len(history[-1]) != constraints.world_size:
            return Decision(tuple(current), False, "no measurements for this world size yet")
        try:
            models, fits = self.models(history, profiles)
        except PlanError as exc:
            return Decision(tuple(current), False, f"keeping the plan: {exc}")
        proposed = equal_time_plan(models, constraints)
        t_new = predict_step_s(models, proposed, comm_s=constraints.comm_s)
        changed_ranks = [r for r, f in enumerate(fits) if f.changed_at_newest]
        note = f"; speed change on rank(s) {changed_ranks}" if changed_ranks else ""
        try:
            constraints.check(current)
        except PlanError as exc:
            return Decision(proposed, True, f"current plan invalid ({exc}){note}", t_new, models)
        t_now = predict_step_s(models, current, comm_s=constraints.comm_s)
        gain = (t_now - t_new) / t_now
        if proposed == tuple(current) or gain <= self.dead_band:
            return Decision(
                tuple(current),
                False,
                f"within dead-band ({gain:+.1%} predicted){note}",
                t_now,
                models,
            )
        return Decision(
            proposed,
            True,
            f"predicted step {t_now * 1e3:.1f} -> {t_new * 1e3:.1f} ms{note}",
            t_new,
            models,
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
            blended.append(StepModel(math.exp(log_a), f.model.fixed_s))
        return tuple(blended), fits


def _speeds(profiles: Sequence[DeviceProfile] | None, world: int) -> list[float]:
    """Relative speeds from profiles, or [] when they cannot serve as a prior."""
    if not profiles or len(profiles) != world:
        return []
    speeds = [p.compute_score for p in profiles]
    if not all(math.isfinite(s) and s > 0 for s in speeds):
        return []
    return speeds


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
