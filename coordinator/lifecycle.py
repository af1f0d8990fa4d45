"""Job and rank state transitions: pure functions of the ranks' states.

States are the names of ``hetero.core.states``' enums (the ``hetero.v1`` enum
names without prefix). A job is QUEUED, with no ranks, while the devices it may
use are busy (``admission``); once placed it is PENDING until a rank runs,
RUNNING while any does, SUCCEEDED when every rank exited 0. Finished states
(SUCCEEDED, FAILED, CANCELLED) never change again; a QUEUED job can only be
placed or cancelled.

A failure — a rank that exits non-zero, or a node that goes down while it holds
ranks of the job — restarts the job while ``restarts < max_restarts``:

1. RESTARTING: every surviving rank is ordered to stop (STOPPING); ranks on a
   node that is down count as gone at once (never wait for a lost node).
   Exits reported in this state are confirmations, not new failures.
2. Once no rank of the old attempt is left (``ready_to_replace``), the store
   places the job again on the healthy devices — perhaps fewer ranks, never
   another global batch — with a fresh rendezvous port and plan, and the job
   is PENDING again; the ranks resume from the job's checkpoint.

With no restart left the failure makes the job FAILED, and its survivors are
stopped as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.errors import HeteroError
from hetero.core.failure import rank_exit_cause
from hetero.core.states import JOB_TERMINAL, RANK_LIVE, JobState, RankState

# The store keeps states by name; the states and their sets are hetero.core.states'.
PENDING, RUNNING, SUCCEEDED = JobState.PENDING.name, JobState.RUNNING.name, JobState.SUCCEEDED.name
FAILED, CANCELLED = JobState.FAILED.name, JobState.CANCELLED.name
RESTARTING, QUEUED = JobState.RESTARTING.name, JobState.QUEUED.name
FINISHED = frozenset(s.name for s in JOB_TERMINAL)
#: States of a placed job whose ranks hold devices and a rendezvous port (or may,
#: while RESTARTING: the old attempt's ranks until they confirm they stopped).
PLACED = frozenset({PENDING, RUNNING, RESTARTING})
ASSIGNED, EXITED, STOPPING = RankState.ASSIGNED.name, RankState.EXITED.name, RankState.STOPPING.name
#: Rank states of a process that exists, or may exist, on its node.
LIVE_RANK_STATES = frozenset(s.name for s in RANK_LIVE)


class TransitionError(HeteroError):
    """A request that the job's current state does not allow."""

    grpc_code = "FAILED_PRECONDITION"


@dataclass(frozen=True)
class RankStatus:
    rank: int
    state: str
    exit_code: int | None = None
    #: Why the agent ended it (e.g. its watchdog), if it said.
    message: str = ""


@dataclass(frozen=True)
class Transition:
    """The job's next state; ``message`` explains a failure or restart ("" otherwise).

    ``restart`` is True exactly when this transition enters RESTARTING: the
    caller stops the survivors; the restart counts once it is placed.
    """

    state: str
    message: str = ""
    restart: bool = False


def failure_cause(ranks: Sequence[RankStatus]) -> str | None:
    """The lowest failed rank described in one line, or None if no rank failed."""
    failed = [r for r in ranks if r.state == EXITED and r.exit_code not in (0, None)]
    if not failed:
        return None
    first = min(failed, key=lambda r: r.rank)
    assert first.exit_code is not None  # failed ranks have one
    return rank_exit_cause(first.rank, first.exit_code, first.message)


def on_failure(cause: str, restarts: int, max_restarts: int) -> Transition:
    """A restart while the job has one left, else FAILED; both say why."""
    if restarts < max_restarts:
        return Transition(RESTARTING, f"restart {restarts + 1} of {max_restarts}: {cause}", True)
    if max_restarts:
        return Transition(FAILED, f"{cause}; no restart left ({max_restarts} used)")
    return Transition(FAILED, cause)


def job_state(
    current: str, ranks: Sequence[RankStatus], restarts: int = 0, max_restarts: int = 0
) -> Transition:
    """The job's next state after a rank's state changed."""
    if current in FINISHED or current in (RESTARTING, QUEUED):
        # Exits while restarting are the stop orders being confirmed.
        return Transition(current)
    cause = failure_cause(ranks)
    if cause is not None:
        return on_failure(cause, restarts, max_restarts)
    if ranks and all(r.state == EXITED for r in ranks):
        return Transition(SUCCEEDED)
    if any(r.state in (RUNNING, EXITED) for r in ranks):
        return Transition(RUNNING)
    return Transition(PENDING)


def node_lost(
    current: str,
    node_name: str,
    ranks_on_node: Sequence[RankStatus],
    restarts: int,
    max_restarts: int,
) -> Transition:
    """The job's next state when ``node_name`` went down holding ``ranks_on_node``."""
    live = [r for r in ranks_on_node if r.state in LIVE_RANK_STATES]
    if current in FINISHED or current == RESTARTING or not live:
        return Transition(current)
    ranks = ", ".join(str(r.rank) for r in sorted(live, key=lambda r: r.rank))
    plural = "s" if len(live) > 1 else ""
    return on_failure(f"node {node_name} went down (rank{plural} {ranks})", restarts, max_restarts)


def rank_state_after_cancel(state: str) -> str:
    """A rank not started yet is simply dropped; a running one must be stopped by its agent."""
    return EXITED if state == ASSIGNED else (STOPPING if state == RUNNING else state)


def rank_state_when_node_lost(state: str) -> str:
    """A rank on a node that went down is gone: nobody is left to confirm it stopped.

    (Its agent, if it is alive but cut off, still ends it: its collectives time
    out, and a stale report of it is told apart by its attempt number.)
    """
    return EXITED if state in LIVE_RANK_STATES else state


def ready_to_replace(ranks: Sequence[RankStatus]) -> bool:
    """True once no rank of the old attempt can still be running."""
    return all(r.state == EXITED for r in ranks)


def restart_world_sizes(wanted: int) -> range:
    """World sizes to try when placing a restarted job, largest first.

    The global batch stays the same at every size, so the training math does
    too; fewer ranks only mean larger per-rank batches.
    """
    return range(wanted, 0, -1)


def check_cancellable(job_id: str, state: str) -> None:
    if state in (SUCCEEDED, FAILED):
        raise TransitionError(f"job {job_id} already finished ({state.lower()})")
