"""What a named caller may touch: a node acts only for itself, a user cancels only its own jobs.

The token interceptor decides which *methods* a credential may call; only the
request tells *what* a call acts on, so this check runs once the request is
decoded, before the handler (``asyncserver``). It applies to callers bound to a
node or user (``identity.Caller.named``) and to callers known by a mapped client
certificate (``Caller.methods``); the cluster token, the shared role tokens and
an unmapped set-up pass unchecked, as before.

A node's credential (``node:gpu-3``) may

- register only under its own name;
- heartbeat and poll orders only for the node id registered under that name;
- report rank states only as that node (the store then checks that the rank is
  placed there, ``store.set_rank_status``);
- append log lines only for ranks placed on that node;
- report interval statistics and read the plan only of jobs with a rank there.

A user's credential (``user:ana``) may cancel only the jobs it submitted (a
job's ``owner``); the cluster token and an "admin" certificate may cancel any.

The checks of a job's ranks answer from memory once the job's placement was read
(``readcache.JobPlacements``, dropped at every write that places or restarts a
job), so ``GetPlan`` of a node's credential is served from the plan cache like any
other. Every refusal is one line naming the caller and what it may not do. A call about
a job or node id the coordinator does not know passes: the handler answers
NOT_FOUND as it would to anyone (an agent re-registers on "unknown node").
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator.identity import Caller
from hetero.coordinator.models import JobRow, NodeRow, RankRow
from hetero.coordinator.readcache import JobPlacements

#: Methods whose request names the caller's node by id.
_NODE_ID_METHODS = ("Heartbeat", "PollAssignments", "ReportRankStatus")
#: Methods whose request names a job that must have a rank on the caller's node.
_JOB_METHODS = ("ReportIntervalStats", "GetPlan")


def _denied(caller: Caller, what: str) -> str:
    return f"permission denied: {caller.label} may not {what}"


class Scope:
    """Checks calls against their caller; remembers node ids' names (a node keeps its id
    and name for life, so the map never goes stale) to answer heartbeats from memory."""

    def __init__(
        self, sessions: sessionmaker[Session], service: str, placements: JobPlacements | None = None
    ) -> None:
        self._sessions = sessions
        self._service = service
        #: Where jobs' ranks are, kept in step with the store (None: read each time).
        self._placements = placements
        self._lock = threading.Lock()
        self._node_names: dict[str, str] = {}

    def learn(self, node_id: str, name: str) -> None:
        """Remember that ``node_id`` is node ``name`` (after a RegisterNode)."""
        with self._lock:
            self._node_names[node_id] = name

    def method_refusal(self, caller: Caller, method: str) -> str | None:
        """Why a certificate's role may not call ``method`` at all, or None."""
        if caller.methods is None or f"/{self._service}/{method}" in caller.methods:
            return None
        role = f" ({caller.role} role)" if caller.role else ""
        return _denied(caller, f"call {method}") + role

    def quick(self, caller: Caller, method: str, request: Any) -> str | bool | None:
        """The verdict from memory alone: True = allowed, a message = refused, None = the
        database must tell (:meth:`check`, off the event loop)."""
        refused = self.method_refusal(caller, method)
        if refused is not None:
            return refused
        who = caller.named
        if who is None:
            return True
        if who.kind == "user":
            return None if method == "CancelJob" else True
        if method == "RegisterNode":
            if request.name != who.name:
                return _denied(caller, f"register node {request.name!r} (it is node {who.name})")
            return True
        if method in _NODE_ID_METHODS:
            with self._lock:
                name = self._node_names.get(request.node_id)
            if name is None:
                return None
            return True if name == who.name else self._not_its_node(caller, method, request, name)
        if method in ("AppendJobLogs", *_JOB_METHODS):
            places = self._placements.get(request.job_id) if self._placements else None
            if places is None:
                return None
            return self._job_refusal(caller, method, request, places) or True
        return True  # Probe

    def check(self, caller: Caller, method: str, request: Any) -> str | None:
        """Why ``caller`` may not make this call, or None; reads the database if needed."""
        verdict = self.quick(caller, method, request)
        if verdict is not None:
            return None if verdict is True else str(verdict)
        who = caller.named
        assert who is not None  # quick() answers every unnamed caller
        with self._sessions() as s:
            if who.kind == "user":
                job = s.get(JobRow, request.job_id)
                if job is None or job.owner == who.label:
                    return None
                owner = job.owner or "an earlier coordinator's caller"
                return _denied(caller, f"cancel job {job.id} (submitted by {owner})")
            if method in _NODE_ID_METHODS:
                node = s.get(NodeRow, request.node_id)
                if node is None:
                    return None
                self.learn(node.id, node.name)
                ok = node.name == who.name
                return None if ok else self._not_its_node(caller, method, request, node.name)
            generation = self._placements.generation() if self._placements else 0
            places = self._rank_places(s, request.job_id)
            if places is None:
                return None
            if self._placements is not None:
                self._placements.put(request.job_id, places, generation)
            return self._job_refusal(caller, method, request, places)

    @staticmethod
    def _job_refusal(
        caller: Caller, method: str, request: Any, places: dict[int, str]
    ) -> str | None:
        """Why a node's credential may not make this call about a job whose ranks are on
        ``places`` (rank -> node name), or None."""
        who = caller.named
        assert who is not None
        if method == "AppendJobLogs":
            foreign = sorted({ln.rank for ln in request.lines if places.get(ln.rank) != who.name})
            if not foreign:
                return None
            ranks = ", ".join(map(str, foreign[:5])) + (", ..." if len(foreign) > 5 else "")
            return _denied(
                caller,
                f"append log lines of job {request.job_id} rank {ranks} "
                f"(not placed on node {who.name})",
            )
        if who.name in places.values():
            return None
        return _denied(
            caller, f"call {method} for job {request.job_id} (no rank on node {who.name})"
        )

    def _not_its_node(self, caller: Caller, method: str, request: Any, name: str) -> str:
        return _denied(caller, f"call {method} for node {request.node_id} (it is node {name})")

    @staticmethod
    def _rank_places(s: Session, job_id: str) -> dict[int, str] | None:
        """Each rank of ``job_id`` and the name of the node it is placed on; None if no such job."""
        if s.get(JobRow, job_id) is None:
            return None
        rows = s.execute(
            select(RankRow.rank, NodeRow.name)
            .join(NodeRow, RankRow.node_id == NodeRow.id)
            .where(RankRow.job_id == job_id)
        )
        return {rank: name for rank, name in rows}
