"""What every policy returns, and the protocol every policy follows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hetero.core.balancer.model import StepModel
from hetero.core.balancer.payback import Horizon
from hetero.core.balancer.plan import Batches, Constraints
from hetero.core.balancer.stats import DeviceProfile, History


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the plan for the next interval and why.

    ``predicted_step_s`` is the fitted models' step time for ``batches``, in
    seconds, including ``Constraints.comm_s``; ``None`` when nothing is fitted.

    ``settled`` is False while the policy expects to move soon: a rank's jump
    waits for the next interval to confirm it, or the best move's predicted gain
    is over half of what it needs to count as real. A caller that spends
    intervals on something else (``comm="auto"``'s trial of overlap, whose
    intervals the planner never sees) waits for a settled plan, so the planner
    keeps its evidence while it still converges.

    ``recheck_steps`` (0: none) asks the caller to run the new plan for that many
    settled steps and ask again *within* the interval: a move made on one point of
    a rank's new speed (``moves.first_move_bound``) is measured at the new plan at
    once, so the second move, which those two levels size, lands in the same
    interval instead of costing the next one its warm-up. A caller that cannot
    re-plan inside an interval ignores it.

    ``not_helping`` (empty: balancing helps, or nothing is known yet) says why the
    plan is, or goes back to, the equal plan while the policy measures: the user's
    answer to "why is hetero not faster than plain DDP here?" (``guard``).
    """

    batches: Batches
    changed: bool
    reason: str
    predicted_step_s: float | None = None
    models: tuple[StepModel, ...] = field(default=(), compare=False)
    settled: bool = field(default=True, compare=False)
    recheck_steps: int = field(default=0, compare=False)
    not_helping: str = field(default="", compare=False)


class Policy(Protocol):
    """A stateless balancer: the caller keeps the history and passes it in whole."""

    # Read-only, so frozen dataclasses (whose fields cannot be set) satisfy it.
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
        horizon: Horizon | None = None,
    ) -> Decision: ...
