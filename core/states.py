"""Job and rank states, written once.

The numbers are the ``hetero.v1`` enums' (``JobState``, ``RankState``), so a
message's field converts with ``JobState(msg.state)``; a unit test pins that the
two agree, so a state added to the proto without one here fails it. The names
are the proto names without their prefix: the coordinator's database stores them
(``JobState.RUNNING.name == "RUNNING"``), and people read them lower-cased
(``JobState.RUNNING.label == "running"``).

A job is QUEUED while the devices it may use are busy, PENDING once placed until
a rank runs, RUNNING while any does, SUCCEEDED when every rank exited 0; a lost
rank or node makes it RESTARTING, then PENDING again (see
``hetero.coordinator.lifecycle`` and ``hetero.coordinator.admission``). The
terminal states never change again.
"""

from __future__ import annotations

import enum


class JobState(enum.IntEnum):
    """A job's state; the numbers are ``hetero.v1.JobState``'s."""

    UNSPECIFIED = 0
    PENDING = 1
    RUNNING = 2
    SUCCEEDED = 3
    FAILED = 4
    CANCELLED = 5
    RESTARTING = 6
    #: Accepted, waiting for devices; it has no ranks yet.
    QUEUED = 7

    @property
    def is_terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and CANCELLED: the job will never run again."""
        return self in JOB_TERMINAL

    @property
    def label(self) -> str:
        """The name people read: ``"running"``."""
        return self.name.lower()


class RankState(enum.IntEnum):
    """A rank's state; the numbers are ``hetero.v1.RankState``'s."""

    UNSPECIFIED = 0
    #: Placed on a node; its agent has not started it yet.
    ASSIGNED = 1
    RUNNING = 2
    EXITED = 3
    #: Ordered to stop (job cancelled or restarting); its agent has not confirmed yet.
    STOPPING = 4

    @property
    def is_terminal(self) -> bool:
        """True for EXITED: no process of this rank is left."""
        return self in RANK_TERMINAL

    @property
    def is_live(self) -> bool:
        """True while a process of this rank exists, or may exist, on its node."""
        return self in RANK_LIVE

    @property
    def label(self) -> str:
        return self.name.lower()


#: Job states that never change again.
JOB_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: Rank states after which no process of the rank is left.
RANK_TERMINAL = frozenset({RankState.EXITED})
#: Rank states of a process that exists, or may exist, on its node.
RANK_LIVE = frozenset({RankState.ASSIGNED, RankState.RUNNING, RankState.STOPPING})


def job_terminal(number: int) -> bool:
    """``JobState(number).is_terminal`` for a number off the wire; a number this
    version does not know (a newer coordinator's state) is not terminal."""
    return number in JOB_TERMINAL


def job_label(number: int) -> str:
    """``JobState(number).label`` for a number off the wire; ``"state N"`` for a
    number this version does not know."""
    try:
        return JobState(number).label
    except ValueError:
        return f"state {number}"


def rank_label(number: int) -> str:
    """``RankState(number).label`` for a number off the wire (see :func:`job_label`)."""
    try:
        return RankState(number).label
    except ValueError:
        return f"state {number}"


#: The labels of :data:`JOB_TERMINAL`, for views that hold labels.
TERMINAL_LABELS = frozenset(s.label for s in JOB_TERMINAL)
