"""What a named caller may touch: a node acts only for itself, a user reads and cancels
only its own jobs.

The token interceptor decides which *methods* a credential may call; only the
request tells *what* a call acts on, so this check runs once the request is
decoded, before the handler (``api``). It applies to callers bound to a
node or user (``identity.Caller.named``) and to callers known by a mapped client
certificate (``Caller.methods``); the cluster token, the shared role tokens and
an unmapped set-up pass unchecked, as before.

A node's credential (``node:gpu-3``) may

- register only under its own name;
- heartbeat and poll orders only for the node id registered under that name;
- report rank states only as that node (the store then checks that the rank is
  placed there, ``cluster.Cluster``);
- append log lines only for ranks placed on that node;
- report interval statistics and read the plan only of jobs with a rank there.

A user's credential (``user:ana``) may cancel only the jobs it submitted (a
job's ``owner``); the cluster token and an "admin" certificate may cancel any.
It also reads only its own jobs: ``GetJob``, ``GetJobDetail`` and ``GetJobLogs``
of another's job are refused, and ``ListJobs`` and ``WatchCluster`` show its own
jobs alone (:func:`own_jobs_only`); nodes stay visible to all. Reading every job
needs the read or admin role: the ``read`` token, a certificate mapped to "read"
or "admin", or the cluster token. The shared tokens (cluster, ``user`` and
``read`` role tokens) read every job, as before: their holders are one caller
each (``identity``), so there is no owner among them to tell apart.
A caller that may not act for nodes (a user's credential, the user role's token)
reports intervals, reads the plan and detaches only for jobs attached by their
launcher (``attach``), and a user's credential only for its own: the jobs the
coordinator launched hear from their agents alone.

Every check reads the coordinator's state in memory (node names, where each job's
ranks are, who submitted it). Every refusal is one line naming the caller and what
it may not do. A call about a job or node id the coordinator does not hold passes:
the handler answers NOT_FOUND as it would to anyone (an agent re-registers on
"unknown node"), and a cancel of a job that ended long ago is checked against its
stored owner by the handler.
"""

from __future__ import annotations

from typing import Any

from hetero.coordinator.identity import Caller
from hetero.coordinator.state import ClusterState

#: Methods whose request names the caller's node by id.
_NODE_ID_METHODS = ("Heartbeat", "WatchOrders", "ReportPeerLinks", "ReportRankStatus")
#: Methods whose request names a job that must have a rank on the caller's node.
_JOB_METHODS = ("ReportIntervalStats", "GetPlan")
#: Methods an attached job's rank 0 calls (``attach``).
_ATTACHED_METHODS = (*_JOB_METHODS, "DetachJob")
#: Methods that read one job, named by ``job_id``.
_READ_JOB_METHODS = ("GetJob", "GetJobDetail", "GetJobLogs")


def denied(caller: Caller, what: str) -> str:
    return f"permission denied: {caller.label} may not {what}"


def own_jobs_only(caller: Caller) -> str | None:
    """The owner whose jobs alone ``caller`` may read (a user's credential: its own
    label), or None: every job."""
    who = caller.named
    return who.label if who is not None and who.kind == "user" else None


def read_refusal(caller: Caller, job_id: str, owner: str) -> str | None:
    """Why ``caller`` may not read job ``job_id`` of ``owner``, or None (the handlers
    check the jobs the state does not hold by their stored owner)."""
    mine = own_jobs_only(caller)
    if mine is None or owner == mine:
        return None
    by = owner or "an earlier coordinator's caller"
    return denied(caller, f"read job {job_id} (submitted by {by})")


class Scope:
    """Checks calls against their caller, from the coordinator's state."""

    def __init__(self, service: str) -> None:
        self._service = service

    def method_refusal(self, caller: Caller, method: str) -> str | None:
        """Why a certificate's role may not call ``method`` at all, or None."""
        if caller.methods is None or f"/{self._service}/{method}" in caller.methods:
            return None
        role = f" ({caller.role} role)" if caller.role else ""
        return denied(caller, f"call {method}") + role

    def _acts_for_nodes(self, caller: Caller) -> bool:
        """Whether ``caller`` may act for nodes (an agent: it may register one)."""
        if caller.named is not None:
            return caller.named.kind == "node"
        return self.method_refusal(caller, "RegisterNode") is None

    def check(self, state: ClusterState, caller: Caller, method: str, request: Any) -> str | None:
        """Why ``caller`` may not make this call, or None."""
        refused = self.method_refusal(caller, method)
        if refused is not None:
            return refused
        who = caller.named
        if method in _ATTACHED_METHODS and not self._acts_for_nodes(caller):
            return _attached_refusal(state, caller, method, request)
        if who is None:
            return None
        if who.kind == "user":
            reads = method in _READ_JOB_METHODS
            job = state.jobs.get(request.job_id) if reads or method == "CancelJob" else None
            if job is None or job.owner == who.label:
                return None
            if reads:
                return read_refusal(caller, job.id, job.owner)
            owner = job.owner or "an earlier coordinator's caller"
            return denied(caller, f"cancel job {job.id} (submitted by {owner})")
        if method == "RegisterNode":
            if request.name != who.name:
                return denied(caller, f"register node {request.name!r} (it is node {who.name})")
            return None
        if method in _NODE_ID_METHODS:
            node = state.nodes.get(request.node_id)
            if node is None or node.name == who.name:
                return None
            return denied(
                caller, f"call {method} for node {request.node_id} (it is node {node.name})"
            )
        if method in ("AppendJobLogs", *_JOB_METHODS):
            job = state.jobs.get(request.job_id)
            if job is None:
                return None
            places = {
                r.rank: (state.nodes[r.node_id].name if r.node_id in state.nodes else r.node_id)
                for r in job.ranks
            }
            return _job_refusal(caller, method, request, places)
        return None  # Probe


def _attached_refusal(state: ClusterState, caller: Caller, method: str, request: Any) -> str | None:
    job = state.jobs.get(request.job_id)
    if job is None:
        return None
    if not job.launcher:
        return denied(caller, f"call {method} for job {job.id} (its agents report for it)")
    who = caller.named
    if who is not None and who.kind == "user" and job.owner != who.label:
        return denied(caller, f"call {method} for job {job.id} (attached by {job.owner})")
    return None


def _job_refusal(caller: Caller, method: str, request: Any, places: dict[int, str]) -> str | None:
    """Why a node's credential may not make this call about a job whose ranks are on
    ``places`` (rank -> node name), or None."""
    who = caller.named
    assert who is not None
    if method == "AppendJobLogs":
        foreign = sorted({ln.rank for ln in request.lines if places.get(ln.rank) != who.name})
        if not foreign:
            return None
        ranks = ", ".join(map(str, foreign[:5])) + (", ..." if len(foreign) > 5 else "")
        return denied(
            caller,
            f"append log lines of job {request.job_id} rank {ranks} "
            f"(not placed on node {who.name})",
        )
    if who.name in places.values():
        return None
    return denied(caller, f"call {method} for job {request.job_id} (no rank on node {who.name})")
