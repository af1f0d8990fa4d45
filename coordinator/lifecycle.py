"""Job and rank state transitions: pure functions of the ranks' states.

States are the ``hetero.v1`` enum names without prefix. A job is PENDING until
a rank runs, RUNNING while any does, SUCCEEDED when every rank exited 0, and
FAILED as soon as one exits non-zero. Finished states never change again.
Restarting a failed job (``max_restarts``) is a later step: it will turn a
FAILED transition into a re-placement instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.errors import HeteroError

PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
)
FINISHED = frozenset({SUCCEEDED, FAILED, CANCELLED})
ASSIGNED, EXITED, STOPPING = "ASSIGNED", "EXITED", "STOPPING"
RANK_STATES = frozenset({ASSIGNED, RUNNING, EXITED, STOPPING})


class TransitionError(HeteroError):
    """A request that the job's current state does not allow."""

    grpc_code = "FAILED_PRECONDITION"


@dataclass(frozen=True)
class RankStatus:
    rank: int
    state: str
    exit_code: int | None = None


def job_state(current: str, ranks: Sequence[RankStatus]) -> tuple[str, str]:
    """The job's next state and a message explaining a failure ("" otherwise)."""
    if current in FINISHED:
        return current, ""
    failed = [r for r in ranks if r.state == EXITED and r.exit_code not in (0, None)]
    if failed:
        first = min(failed, key=lambda r: r.rank)
        return FAILED, f"rank {first.rank} exited with code {first.exit_code}"
    if ranks and all(r.state == EXITED for r in ranks):
        return SUCCEEDED, ""
    if any(r.state in (RUNNING, EXITED) for r in ranks):
        return RUNNING, ""
    return PENDING, ""


def rank_state_after_cancel(state: str) -> str:
    """A rank not started yet is simply dropped; a running one must be stopped by its agent."""
    return EXITED if state == ASSIGNED else (STOPPING if state == RUNNING else state)


def check_cancellable(job_id: str, state: str) -> None:
    if state in (SUCCEEDED, FAILED):
        raise TransitionError(f"job {job_id} already finished ({state.lower()})")
