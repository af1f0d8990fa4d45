"""Balancer policies: pure functions of (history, current plan, constraints, profiles).

Each policy is a frozen dataclass holding its configuration; ``initial`` gives
the plan before anything is measured and ``next_plan`` the plan for the next
interval. No state lives in a policy: the caller keeps the history, so the
trainer's embedded mode and the coordinator run the same code on the same data.

The measurement-driven policies (``dynamic``, ``hybrid``) live in ``dynamic.py``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetero.core.balancer.decision import Decision, Policy
from hetero.core.balancer.dynamic import Dynamic, Hybrid
from hetero.core.balancer.payback import Horizon
from hetero.core.balancer.plan import Batches, Constraints, equal_batches, round_to_plan
from hetero.core.balancer.stats import DeviceProfile, History
from hetero.core.errors import ConfigError

__all__ = [
    "POLICIES",
    "Decision",
    "Dynamic",
    "Equal",
    "Hybrid",
    "Policy",
    "Proportional",
    "make_policy",
]


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
        horizon: Horizon | None = None,
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
        horizon: Horizon | None = None,
    ) -> Decision:
        return Decision(current, False, "proportional split is static")


POLICIES: dict[str, type[Equal] | type[Proportional] | type[Dynamic] | type[Hybrid]] = {
    "equal": Equal,
    "proportional": Proportional,
    "dynamic": Dynamic,
    "hybrid": Hybrid,
}


def make_policy(name: str, **params: Any) -> Policy:
    """The policy called ``name``, configured by ``params`` (its dataclass fields).

    An unknown name or parameter raises ``ConfigError`` naming it, with the
    closest known spelling.
    """
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ConfigError(_unknown("policy", name, sorted(POLICIES))) from None
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "name"]
    for key in params:
        if key not in fields:
            raise ConfigError(_unknown(f"{name} policy parameter", key, fields))
    return cls(**params)


def _unknown(what: str, given: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(given, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listing = ", ".join(known) if known else "none"
    return f"unknown {what} {given!r} (known: {listing}){hint}"
