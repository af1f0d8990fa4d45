"""When and how a job re-plans, written once for the coordinator and the trainer.

The trainer's embedded planner and the coordinator (for jobs under agents) follow
the same rule:

- a rebalance boundary closes every ``rebalance_interval`` steps
  (:func:`is_boundary`); only there may the plan change;
- the next plan is the job's policy over the recent complete intervals
  (:func:`next_plan`), compared against the plan the ranks really ran
  (:func:`running_plan`): a trainer that lost its agent for a while re-plans on
  its own, and the two must stay in step;
- the coordinator answers a report with a new plan only if the report is of the
  current attempt, the job is not finished, the interval ran the newest plan,
  and it closes a boundary (:func:`should_replan`). A trainer applies an answer
  one interval late (``hetero.trainer.control``), so an interval of the plan
  before says nothing new, and re-planning on it would store a duplicate.

Pure: the coordinator loads history and plans from its store and stores the
result; the trainer keeps them in memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer import (
    Batches,
    Constraints,
    Decision,
    DeviceProfile,
    History,
    Horizon,
    Policy,
    estimate_comm_s,
    make_policy,
)
from hetero.core.errors import PlanError
from hetero.core.states import JobState

#: Intervals of history a policy fits for a report on the coordinator: it is handed
#: one more, so that what it knew before the newest interval is fitted on as many
#: (the previous report's fit, kept: ``balancer.dynamic``).
HISTORY_WINDOW = 16


@dataclass(frozen=True)
class Replan:
    decision: Decision
    #: The reported boundary: the earliest step the new plan could run from. Rank 0
    #: of a job under an agent picks the answer up at its next boundary and schedules
    #: it after the loader's prefetch depth (trainer/control.py), broadcasting plan and
    #: step so all ranks agree; the trainer's metrics record the step it ran from.
    apply_at_step: int


def is_boundary(step: int, rebalance_interval: int) -> bool:
    """True if the interval ending after ``step`` steps closes a rebalance interval."""
    return step > 0 and step % rebalance_interval == 0


def should_replan(
    *,
    ran_version: int,
    attempt_first_version: int,
    newest_version: int,
    job_state: JobState,
    end_step: int,
    rebalance_interval: int,
) -> bool:
    """Whether a report of the interval ending at ``end_step``, which ran plan
    ``ran_version``, may change the plan (see the module doc). Plan versions:
    ``attempt_first_version`` is the current attempt's first, ``newest_version``
    the newest stored."""
    return (
        ran_version >= attempt_first_version
        and not job_state.is_terminal
        and ran_version >= newest_version
        and is_boundary(end_step, rebalance_interval)
    )


def running_plan(batches: Sequence[int], constraints: Constraints) -> Batches | None:
    """``batches`` (what the ranks ran) if they are a valid plan under ``constraints``."""
    try:
        constraints.check(batches)
    except PlanError:
        return None
    return tuple(batches)


def next_plan(
    policy: Policy,
    history: History,
    current: Batches,
    constraints: Constraints,
    profiles: Sequence[DeviceProfile] | None = None,
    horizon: Horizon | None = None,
) -> Decision:
    """The policy's decision over ``history`` (oldest first) from plan ``current``;
    ``horizon`` says how long a new plan would run (the pay-back rule's).

    The step time the job waits for beyond every rank's own work (the exposed
    all-reduce, ``estimate_comm_s``) is measured from ``history`` here, for the
    trainer and the coordinator alike: without it a predicted gain is a share of
    the ranks' work alone, and a move that saves 1.5 of a 6.6 ms step read as 40%."""
    if history and constraints.comm_s == 0.0:
        constraints = dataclasses.replace(constraints, comm_s=estimate_comm_s(history))
    return policy.next_plan(history, current, constraints, profiles, horizon)


def horizon(rebalance_interval: int, step: int, total_steps: int | None) -> Horizon:
    """How long a plan adopted at ``step`` runs: intervals of ``rebalance_interval``
    steps, and to the job's end where its length is known."""
    left = None if total_steps is None else max(total_steps - step, 0)
    return Horizon(rebalance_interval, left)


def replan(
    policy: str,
    history: History,
    current: Batches,
    constraints: Constraints,
    profiles: Sequence[DeviceProfile],
    end_step: int,
    plan_horizon: Horizon | None = None,
) -> Replan:
    """The coordinator's answer to a report ending at ``end_step``: policy ``policy``
    fitting the newest :data:`HISTORY_WINDOW` intervals of ``history``."""
    chosen = make_policy(policy)
    if getattr(chosen, "history_window", 0) > HISTORY_WINDOW:  # the policies that fit
        chosen = dataclasses.replace(chosen, history_window=HISTORY_WINDOW)  # type: ignore[type-var]
    window = tuple(history)[-(HISTORY_WINDOW + 1) :]
    decision = next_plan(chosen, window, current, constraints, profiles, plan_horizon)
    return Replan(decision, apply_at_step=end_step)
