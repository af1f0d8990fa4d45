"""Balancer policies: pure functions of (history, current plan, constraints, profiles).

Each policy is a frozen dataclass holding its configuration; ``initial`` gives
the plan before anything is measured and ``next_plan`` the plan for the next
interval. No state lives in a policy: the caller keeps the history, so the
trainer's embedded mode and the coordinator run the same code on the same data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hetero.coordinator.balancer.model import (
    StepModel,
    equal_time_plan,
    fit_step_model,
    predict_step_s,
)
from hetero.coordinator.balancer.plan import Batches, Constraints, equal_batches, round_to_plan
from hetero.coordinator.balancer.stats import DeviceProfile, History
from hetero.errors import ConfigError


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the plan for the next interval and why."""

    batches: Batches
    changed: bool
    reason: str
    predicted_step_s: float | None = None
    models: tuple[StepModel, ...] = field(default=(), compare=False)


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches: ...

    def next_plan(
        self,
        history: History,
        current: Batches,
        constraints: Constraints,
        profiles: Sequence[DeviceProfile] | None = None,
    ) -> Decision: ...


def _proportional_to_profiles(
    constraints: Constraints, profiles: Sequence[DeviceProfile] | None
) -> Batches:
    if not profiles or len(profiles) != constraints.world_size:
        return equal_batches(constraints)
    return round_to_plan([max(p.compute_score, 0.0) for p in profiles], constraints)


@dataclass(frozen=True)
class Equal:
    """Every rank gets B/W: what plain DDP does."""

    name: str = "equal"

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches:
        return equal_batches(constraints)

    def next_plan(
        self,
        history: History,
        current: Batches,
        constraints: Constraints,
        profiles: Sequence[DeviceProfile] | None = None,
    ) -> Decision:
        return Decision(current, False, "equal split is fixed")


@dataclass(frozen=True)
class Proportional:
    """A static split proportional to each device's hardware compute score."""

    name: str = "proportional"

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches:
        return _proportional_to_profiles(constraints, profiles)

    def next_plan(
        self,
        history: History,
        current: Batches,
        constraints: Constraints,
        profiles: Sequence[DeviceProfile] | None = None,
    ) -> Decision:
        return Decision(current, False, "proportional split is static")


@dataclass(frozen=True)
class Dynamic:
    """Fit ``t_i(b) = a_i·b + c_i`` per rank from recent intervals, solve for equal time.

    ``window`` intervals are fitted, newest weighted most (``recency``). A new plan
    is adopted only if it lowers the predicted step time by more than
    ``dead_band`` (a fraction), so measurement noise does not make plans
    oscillate.
    """

    window: int = 8
    recency: float = 0.7
    dead_band: float = 0.02
    name: str = "dynamic"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ConfigError(f"dynamic.window must be >= 1, got {self.window}")
        if not 0.0 < self.recency <= 1.0:
            raise ConfigError(f"dynamic.recency must be in (0, 1], got {self.recency}")
        if not 0.0 <= self.dead_band < 1.0:
            raise ConfigError(f"dynamic.dead_band must be in [0, 1), got {self.dead_band}")

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches:
        return equal_batches(constraints)

    def fit(self, history: History) -> tuple[StepModel, ...]:
        """One step-time model per rank from the last ``window`` intervals."""
        recent = list(history)[-self.window :]
        world = len(recent[-1])
        models = []
        for rank in range(world):
            points = [(iv[rank].batch, iv[rank].compute_s) for iv in recent if iv[rank].steps > 0]
            models.append(fit_step_model(points, recency=self.recency))
        return tuple(models)

    def next_plan(
        self,
        history: History,
        current: Batches,
        constraints: Constraints,
        profiles: Sequence[DeviceProfile] | None = None,
    ) -> Decision:
        if not history:
            return Decision(current, False, "no measurements yet")
        models = self.fit(history)
        proposed = equal_time_plan(models, constraints)
        t_now = predict_step_s(models, current)
        t_new = predict_step_s(models, proposed)
        if proposed == tuple(current) or t_now - t_new <= self.dead_band * t_now:
            return Decision(
                tuple(current),
                False,
                f"within dead-band ({(t_now - t_new) / t_now:+.1%} predicted)",
                t_now,
                models,
            )
        return Decision(
            proposed,
            True,
            f"predicted step {t_now * 1e3:.1f} -> {t_new * 1e3:.1f} ms",
            t_new,
            models,
        )


POLICIES: dict[str, type[Equal] | type[Proportional] | type[Dynamic]] = {
    "equal": Equal,
    "proportional": Proportional,
    "dynamic": Dynamic,
}


def make_policy(name: str) -> Policy:
    """The policy called ``name`` with its default configuration."""
    try:
        return POLICIES[name]()
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ConfigError(f"unknown policy {name!r} (known: {known})") from None
