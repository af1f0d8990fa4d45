"""When and how a job re-plans: the balancer policy over stored interval history.

Pure: the servicer loads the history and the current plan from the store, calls
``replan``, and stores the result if it changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer import (
    Batches,
    Constraints,
    Decision,
    DeviceProfile,
    History,
    make_policy,
)

#: Intervals of history the policy sees; the dynamic policy fits its own window from these.
HISTORY_WINDOW = 16


@dataclass(frozen=True)
class Replan:
    decision: Decision
    #: The reported boundary: the earliest step the new plan could run from. Rank 0
    #: of a job under an agent picks the answer up at its next boundary and schedules
    #: it after the loader's prefetch depth (trainer/control.py), broadcasting plan and
    #: step so all ranks agree; the trainer's metrics record the step it ran from.
    apply_at_step: int


def is_boundary(end_step: int, rebalance_interval: int) -> bool:
    """True if a report ending at ``end_step`` closes a rebalance interval."""
    return end_step > 0 and end_step % rebalance_interval == 0


def replan(
    policy: str,
    history: History,
    current: Batches,
    constraints: Constraints,
    profiles: Sequence[DeviceProfile],
    end_step: int,
) -> Replan:
    decision = make_policy(policy).next_plan(history, current, constraints, profiles)
    return Replan(decision, apply_at_step=end_step)
