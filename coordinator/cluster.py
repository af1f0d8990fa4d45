"""The rules that change the cluster's state: nodes joining, beating and going down; jobs
submitted, queued, placed, cancelled, failing, restarting and leaving a rank out.

This module is the one place those rules run (before, they ran in the store's
transactions, ``store.jobs``, ``store.queue``, ``recovery``). Each method changes the
in-memory state (``state``) on the event loop and collects what makes the change
durable: the write operations (``persist``), in order, and the nodes whose orders
(launches, stops) it changed. The caller takes them (``take``), puts the operations on
the writer (``writer``) and, where the caller is answered or an agent is told, waits
for their commit first. Pure but for that: no database, no gRPC, time passed in.

The job lifecycle is ``lifecycle``'s, placement ``placement``'s, the queue's pass
``admission``'s, leaving a rank out ``exclusion``'s; this module applies their
decisions to the state.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hetero.coordinator import admission, exclusion, lifecycle, peerlinks, persist, restarts
from hetero.coordinator.placement import (
    DeviceSlot,
    Placement,
    initial_plan,
    suitable,
)
from hetero.coordinator.state import (
    ClusterState,
    Device,
    Event,
    Job,
    Node,
    Plan,
    Rank,
)
from hetero.coordinator.writer import Op
from hetero.core import defaults
from hetero.core.balancer import Batches
from hetero.core.errors import HeteroError
from hetero.core.jobspec import JobSpec

log = logging.getLogger("hetero.coordinator")

#: Queued jobs one admission pass looks at, at most: a bound on its time when thousands
#: wait behind held devices; those further back keep their reason until the head moves.
MAX_EXAMINED = 1000
#: Seconds a restarting job waits for its agents to confirm the old ranks stopped.
STOP_TIMEOUT_S = 60.0


class NotFoundError(HeteroError):
    grpc_code = "NOT_FOUND"


@dataclass(frozen=True)
class Rules:
    """What the rules need besides the state, in seconds: node health, the first
    rendezvous port and how many, CPU capacity, how long a restart waits for its old
    ranks' confirmation. ``started_at`` is when this coordinator started (Unix s): a
    node's silence counts from there at most."""

    heartbeat_timeout_s: float
    started_at: float
    master_port_base: int = defaults.MASTER_PORT_BASE
    master_port_span: int = defaults.MASTER_PORT_SPAN
    ranks_per_cpu_device: int = admission.Limits.ranks_per_cpu_device
    stop_timeout_s: float = STOP_TIMEOUT_S


class Cluster:
    """The state and the rules that change it. ``capacity`` counts changes that may let a
    waiting job fit: only a submission runs the queue's pass itself (its caller learns
    whether it was placed); for every other change the service's admission task runs
    one pass soon, once for a burst. The sweep and restarts are ``restarts``' rules,
    which the methods below hand over to."""

    def __init__(self, state: ClusterState, rules: Rules) -> None:
        self.state = state
        self.rules = rules
        self.capacity = 0
        self._ops: list[Op] = []
        self._touched: set[str] = set()
        #: When each pair of nodes was last asked to measure its link (``peerlinks``).
        self.link_asks: dict[frozenset[str], float] = {}

    def take(self) -> tuple[list[Op], set[str]]:
        """The write operations collected since the last call, in order, and the nodes
        whose orders changed."""
        ops, touched = self._ops, self._touched
        self._ops, self._touched = [], set()
        return ops, touched

    def add(self, op: Op) -> None:
        """A write of the caller's own, in order with the rules' (an interval's rows)."""
        self._ops.append(op)

    def job(self, job_id: str) -> Job:
        job = self.state.jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"unknown job {job_id!r}")
        return job

    def node(self, node_id: str) -> Node:
        node = self.state.nodes.get(node_id)
        if node is None:
            raise NotFoundError(f"unknown node {node_id!r}: register first")
        return node

    # ---- the journal and plans ---------------------------------------------------------

    def event(
        self, kind: str, message: str, *, now: float, job: Job | None = None, node_id: str = ""
    ) -> Event:
        e = Event(
            self.state.new_event_id(),
            now,
            kind,
            message,
            job.id if job else None,
            node_id or None,
        )
        if job is not None:
            job.events.append(e)
        self._ops.append(persist.add_events([e]))
        return e

    def new_plan(
        self,
        job: Job,
        batches: Batches,
        apply_at_step: int,
        policy: str,
        reason: str,
        *,
        now: float,
        predicted_step_s: float | None = None,
    ) -> Plan:
        version = (job.plan.version if job.plan is not None else 0) + 1
        plan = Plan(version, apply_at_step, tuple(batches), policy, reason, now, predicted_step_s)
        job.plan = plan
        self._ops.append(persist.add_plan(job.id, plan))
        return plan

    def save(self, job: Job, *, ranks: bool = True) -> None:
        """Write ``job`` as it is now; its ranks' nodes get their orders again."""
        self._ops.append(persist.save_job(job, ranks=ranks))
        if ranks:
            self._touched.update(r.node_id for r in job.ranks)

    # ---- nodes ---------------------------------------------------------------------------

    def register(
        self,
        *,
        name: str,
        address: str,
        agent_endpoint: str,
        agent_version: str,
        devices: Sequence[Device],
        now: float,
        host_profile: object | None = None,
    ) -> Node:
        """Create the node, or refresh it (same id, devices replaced) if the name is known.
        New devices may let the queue move: ``capacity`` counts it, and the service runs
        the pass soon (one pass for a burst of registrations, not one each)."""
        node = self.state.node_named(name)
        if node is None:
            node = Node(uuid.uuid4().hex[:12], name, address, "", "", now, now)
            self.state.add_node(node)
            self.event("node_registered", f"node {name} registered", now=now, node_id=node.id)
        node.address, node.agent_endpoint, node.agent_version = (
            address,
            agent_endpoint,
            agent_version,
        )
        node.devices = tuple(devices)
        node.host_profile = peerlinks.registered(node.host_profile, host_profile)
        self._heard(node, now)
        self._ops.append(persist.save_node(node, devices=True))
        self.capacity += 1
        return node

    def heartbeat(self, node_id: str, now: float) -> Node:
        """The node is alive as of ``now``; a node marked down is up again (written)."""
        node = self.node(node_id)
        if node.down:
            self._heard(node, now)
            self._ops.append(persist.save_node(node))
            self.capacity += 1
        else:
            node.last_heartbeat_unix_s = max(node.last_heartbeat_unix_s, now)
        return node

    def _heard(self, node: Node, now: float) -> None:
        node.last_heartbeat_unix_s = max(node.last_heartbeat_unix_s, now)
        if node.down:
            node.down = False
            self.event("node_up", f"node {node.name} is back", now=now, node_id=node.id)

    def drain(self, ref: str, draining: bool, *, now: float) -> Node:
        """Drain a node (no new ranks; running ones stay) or undo it. Idempotent."""
        node = self.state.find_node(ref)
        if node is None:
            raise NotFoundError(f"unknown node {ref!r} (neither an id nor a name)")
        if node.draining != draining:
            node.draining = draining
            kind, what = (
                ("node_drained", "drained") if draining else ("node_undrained", "undrained")
            )
            self.event(kind, f"node {node.name} {what}", now=now, node_id=node.id)
            self._ops.append(persist.save_node(node))
            self.capacity += 1
        return node

    # ---- jobs ----------------------------------------------------------------------------

    def devices(self, now: float) -> list[DeviceSlot]:
        return self.state.device_slots(
            now=now,
            timeout_s=self.rules.heartbeat_timeout_s,
            cpu_capacity=self.rules.ranks_per_cpu_device,
        )

    def submit(
        self, spec: JobSpec, spec_yaml: str, *, now: float, priority: int, owner: str
    ) -> tuple[Job, Placement | None]:
        """Queue a new job and run a pass: it is placed at once if it fits and nothing
        ahead of it waits for its devices (its placement is returned); else it waits,
        with a reason. The caller checked it could ever fit and the owner's limit."""
        job = Job(
            id=uuid.uuid4().hex[:12],
            name=spec.name,
            spec=spec,
            spec_yaml=spec_yaml,
            state=lifecycle.QUEUED,
            submitted_at_unix_s=now,
            world_size=spec.world_size,
            priority=priority,
            owner=owner,
        )
        self.state.add_job(job)
        placed = self.admit(now=now)
        if job.state != lifecycle.QUEUED:
            return job, placed.get(job.id)
        if not job.message:  # the pass stopped before it: the jobs ahead have no room
            ahead = self.state.ahead_of(job)
            job.message = f"waiting behind {ahead:,} queued job{'s' if ahead != 1 else ''}"
        self.event("job_queued", f"job {job.name} queued: {job.message}", now=now, job=job)
        self.save(job)
        return job, None

    def admit(self, *, now: float) -> dict[str, Placement]:
        """One admission pass (``admission.admit``): place the queued jobs that fit, in
        queue order; update the reasons of those looked at that still wait."""
        queued = self.state.queued(MAX_EXAMINED)
        if not queued:
            return {}
        devices = self.devices(now)
        by_id = {j.id: j for j in queued}
        queue = (admission.Waiting(j.id, _spec_of(j)) for j in queued)
        ports = self.state.free_ports(self.rules.master_port_base, self.rules.master_port_span)
        placed: dict[str, Placement] = {}
        for decision in admission.admit(queue, devices, ports, self._held_for_restarts(devices)):
            job = by_id[decision.job_id]
            if decision.placement is not None:
                placed[job.id] = self._place(job, job.spec, decision.placement, now=now)
            elif job.message != decision.reason:
                job.message = decision.reason
                self.save(job, ranks=False)
        return placed

    def _held_for_restarts(self, devices: list[DeviceSlot]) -> set[admission.DeviceKey]:
        """The devices a restart waiting for its devices may use: no queued job takes them."""
        held: set[admission.DeviceKey] = set()
        for job in self.state.restarting_jobs():
            if not all(r.state == lifecycle.EXITED for r in job.ranks):
                continue
            excluded = exclusion.excluded_of(job)
            spec = exclusion.spec_without(job.spec, excluded)
            usable = exclusion.devices_without(devices, excluded)
            held |= {admission.key(d) for d in usable if suitable(spec, d)}
        return held

    def _place(self, job: Job, spec: JobSpec, placement: Placement, *, now: float) -> Placement:
        """Give a queued job its ranks, rendezvous and first plan: PENDING."""
        self.state.left_queue(job)
        job.state, job.message = lifecycle.PENDING, ""
        self._set_ranks(job, placement, now=now)
        self.save(job)  # a new job's row before its plan's, which refers to it
        first = initial_plan(spec, placement, peerlinks.between(self.state, placement))
        self.new_plan(job, first.batches, 0, first.policy, first.reason, now=now)
        emulated = " (emulated slowdown)" if placement.emulated else ""
        waited = now - job.submitted_at_unix_s
        kind, after = (
            ("job_placed", f" after {waited:.1f} s in the queue")
            if waited > 0
            else ("job_submitted", "")
        )
        text = f"job {spec.name} placed on {spec.world_size} ranks, {placement.backend}{emulated}{after}"
        self.event(kind, text, now=now, job=job)
        self.capacity += 1
        self.save(job)
        return placement

    def _set_ranks(self, job: Job, placement: Placement, *, now: float) -> None:
        """Give ``job`` the ranks of ``placement``, and ask for the links it spans."""
        node_ids = [r.device.node_id for r in placement.ranks]
        self._touched |= peerlinks.ask(self.state, self.link_asks, node_ids, now=now)
        self._touched.update(r.node_id for r in job.ranks)  # the old ranks' nodes too
        job.world_size = len(placement.ranks)
        job.backend = placement.backend
        job.master_addr, job.master_port = placement.master_addr, placement.master_port
        job.ranks = [
            Rank(
                rank=r.rank,
                node_id=r.device.node_id,
                device_index=r.device.index,
                device_kind=r.device.kind,
                device_name=r.device.name,
                local_rank=r.local_rank,
                state=lifecycle.ASSIGNED,
                emulated_slowdown=r.emulated_slowdown,
                effective_score=r.effective_score,
            )
            for r in placement.ranks
        ]

    def cancel(self, job_id: str, *, now: float) -> Job:
        """Cancel a queued or placed job (its running ranks are ordered to stop); its
        devices count as free at once, so the queue moves."""
        job = self.job(job_id)
        if job.state == lifecycle.CANCELLED:
            return job
        lifecycle.check_cancellable(job_id, job.state)
        self.state.left_queue(job)
        for rank in job.ranks:
            rank.state = lifecycle.rank_state_after_cancel(rank.state)
        job.state, job.finished_at_unix_s, job.message = (
            lifecycle.CANCELLED,
            now,
            "cancelled by user",
        )
        self.event("job_cancelled", f"job {job.name} cancelled", now=now, job=job)
        self.capacity += 1
        self.save(job)
        return job

    def rank_status(
        self,
        job_id: str,
        rank: int,
        *,
        node_id: str,
        state: str,
        exit_code: int | None,
        now: float,
        attempt: int = 0,
        message: str = "",
    ) -> Job:
        """Record what an agent saw of one rank, then move the job along its lifecycle: a
        restart whose old ranks are all gone is placed now; a rank that exited, or a job
        that ended, frees devices, which ``capacity`` counts for the queue's next pass (the
        service's admission task). A report about an earlier ``attempt`` changes nothing."""
        job = self.job(job_id)
        if attempt != job.restarts:
            return job
        row = next((r for r in job.ranks if r.rank == rank), None)
        if row is None or row.node_id != node_id:
            raise NotFoundError(f"job {job_id} has no rank {rank} on node {node_id}")
        row.state, row.exit_code = state, exit_code
        statuses = [_status(r, message if r.rank == rank else "") for r in job.ranks]
        restarts = job.restarts - job.exclusion_restarts
        self.transition(
            job, lifecycle.job_state(job.state, statuses, restarts, job.max_restarts), now=now
        )
        if state == lifecycle.EXITED:
            self.capacity += 1
        self.save(job)
        self.replace_if_ready(job, now=now)
        return job

    def transition(
        self, job: Job, t: lifecycle.Transition, *, now: float, lost_node: str | None = None
    ) -> None:
        """Make ``t`` so: the job's state and message, its ranks' stop orders, an event.
        Ranks on ``lost_node`` (down) count as gone at once; the others are ordered to
        stop when the job fails or restarts (the survivors would block in a collective)."""
        if t.state == job.state:
            return
        job.state = t.state
        job.message = t.message or job.message
        if t.state in lifecycle.FINISHED:
            job.finished_at_unix_s = now
        if t.state == lifecycle.SUCCEEDED and job.total_steps is not None:
            # Every rank exited 0 after its last step: a run whose last interval was
            # shorter than the others reported no statistics for its last steps.
            job.last_step = max(job.last_step, job.total_steps)
        if t.state in (lifecycle.FAILED, lifecycle.RESTARTING):
            for other in job.ranks:
                if other.node_id == lost_node:
                    other.state = lifecycle.rank_state_when_node_lost(other.state)
                else:
                    other.state = lifecycle.rank_state_after_cancel(other.state)
        self.capacity += 1
        if t.restart:
            job.restarting_since_unix_s = now
            self.event("job_restarting", f"job {job.name} {t.message}", now=now, job=job)
            return
        text = f"job {job.name} {job.state.lower()}" + (f": {t.message}" if t.message else "")
        self.event(f"job_{job.state.lower()}", text, now=now, job=job)

    def restart_without(self, job: Job, decision: exclusion.Decision, *, now: float) -> None:
        """Restart a running job from its checkpoint without the rank ``decision`` leaves
        out (recorded on the job, so its placements leave it out from now on)."""
        exclusion.record(job, decision.entry)
        job.exclusion_restarts += 1
        self.event("rank_excluded", decision.message, now=now, job=job)
        why = f"restarting from its checkpoint without rank {decision.forecast.rank}"
        self.transition(job, lifecycle.Transition(lifecycle.RESTARTING, why, True), now=now)
        self.save(job)

    # ---- what goes wrong: the sweep and restarts (``restarts``) -----------------------

    def sweep(self, *, now: float, admit: bool = True) -> None:
        restarts.sweep(self, now=now, admit=admit)

    def place_waiting(self, *, now: float, admit: bool = True) -> None:
        restarts.place_waiting(self, now=now, admit=admit)

    def replace_if_ready(self, job: Job, *, now: float) -> bool:
        return restarts.replace_if_ready(self, job, now=now)


def _spec_of(job: Job) -> Callable[[], JobSpec]:
    return lambda: job.spec


def _status(r: Rank, message: str = "") -> lifecycle.RankStatus:
    return lifecycle.RankStatus(r.rank, r.state, r.exit_code, message)
