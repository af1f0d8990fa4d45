"""The cluster's rules for what goes wrong: the sweep (nodes silent past the timeout are
down, and the jobs with ranks there restart or fail) and restarts (a RESTARTING job's
next attempt placed once its old ranks are gone: on the healthy devices, perhaps fewer
ranks, never another global batch, a new rendezvous port and plan; a restart that fits
nowhere now waits ahead of the queue, holding its devices; one that could never fit
fails). A mixin of ``cluster.Cluster``, on the same state and collected writes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetero.coordinator import admission, attach, exclusion, lifecycle, peerlinks, persist
from hetero.coordinator.placement import InitialPlan, Placement, PlacementError, initial_plan, place
from hetero.coordinator.state import KEEP_FINISHED_S, Job, Node, Rank
from hetero.core.errors import HeteroError
from hetero.core.jobspec import JobSpec

if TYPE_CHECKING:
    from hetero.coordinator.cluster import Cluster

log = logging.getLogger("hetero.coordinator")


class PortsExhaustedError(HeteroError):
    """Every port of the rendezvous range is held by a placed job."""

    grpc_code = "RESOURCE_EXHAUSTED"


def sweep(c: Cluster, *, now: float, admit: bool = True) -> None:
    """Mark nodes silent past the timeout down (their jobs restart or fail), place the
    restarts that can be, then (``admit``, or after this sweep moved something) the
    queued jobs that fit. A coordinator that just started counts silence from its
    own start: agents need a moment to reconnect after its restart."""
    before = c.capacity
    timeout = c.rules.heartbeat_timeout_s
    if now - c.rules.started_at > timeout:
        silent = [
            n
            for n in c.state.nodes.values()
            if not n.down and n.last_heartbeat_unix_s < now - timeout
        ]
        for node in sorted(silent, key=lambda n: n.name):
            silent_s = now - node.last_heartbeat_unix_s
            node.down = True
            text = f"node {node.name} down: silent for {silent_s:.1f} s"
            c.event("node_down", text, now=now, node_id=node.id)
            c._ops.append(persist.save_node(node))
            log.warning("node %s down: no heartbeat for %.1f s", node.name, silent_s)
            lose_node(c, node, now=now)
            c.capacity += 1
    place_waiting(c, now=now, admit=admit or c.capacity != before)
    attach.sweep(c, now=now)
    for job_id in c.state.finished_before(now - KEEP_FINISHED_S):
        c.state.forget_job(job_id)


def lose_node(c: Cluster, node: Node, *, now: float) -> None:
    """Every active job with ranks on ``node`` (down) restarts or fails; its ranks
    there are gone."""
    for job in sorted(c.state.unqueued(), key=lambda j: j.submitted_at_unix_s):
        on_node = [r for r in job.ranks if r.node_id == node.id]
        live = [r for r in on_node if r.state in lifecycle.LIVE_RANK_STATES]
        if job.finished or not live:
            continue
        restarts = job.restarts - job.exclusion_restarts
        t = lifecycle.node_lost(
            job.state, node.name, [_status(r) for r in on_node], restarts, job.max_restarts
        )
        c.transition(job, t, now=now, lost_node=node.id)
        for r in on_node:  # a job already restarting or failed: nobody confirms these
            r.state = lifecycle.rank_state_when_node_lost(r.state)
        c.save(job)


def place_waiting(c: Cluster, *, now: float, admit: bool = True) -> None:
    """Place what waits for devices: the restarts first, then, with ``admit`` or after
    a restart moved, the queued jobs that fit."""
    moved = False
    for job in c.state.restarting_jobs():
        if replace_if_ready(c, job, now=now) or job.state != lifecycle.RESTARTING:
            moved = True
    if admit or moved:
        c.admit(now=now)


def replace_if_ready(c: Cluster, job: Job, *, now: float) -> bool:
    """Place a RESTARTING job's next attempt once its old ranks are gone; True if
    placed. A restart that fits nowhere now waits, holding its devices; one that
    could never fit the devices left to it fails the job."""
    if job.state != lifecycle.RESTARTING:
        return False
    if not lifecycle.ready_to_replace([_status(r) for r in job.ranks]):
        since = job.restarting_since_unix_s or now
        if now - since < c.rules.stop_timeout_s:
            return False
        stuck = [r.rank for r in job.ranks if r.state != lifecycle.EXITED]
        c.event(
            "ranks_unconfirmed",
            f"job {job.name}: ranks {stuck} not confirmed stopped after "
            f"{c.rules.stop_timeout_s:.0f} s; placing the restart anyway",
            now=now,
            job=job,
        )
        for r in job.ranks:
            r.state = lifecycle.EXITED
    nodes = c.state.nodes
    # The attempt that ended measured its ranks with each other: its forecast holds
    # only while all their nodes are up (a lost one changes who takes the samples).
    if all(r.node_id in nodes and not nodes[r.node_id].down for r in job.ranks):
        names = {n.id: n.name for n in nodes.values()}
        history = [list(ranks) for _, ranks in job.history]
        decision = exclusion.measured(job.spec, job, history, names)
        if decision is not None:
            exclusion.record(job, decision.entry)
            c.event("rank_excluded", decision.message, now=now, job=job)
    excluded = exclusion.excluded_of(job)
    spec = exclusion.spec_without(job.spec, excluded)
    try:
        placement = _place_restart(c, spec, excluded, now=now)
    except HeteroError as exc:
        _wait_or_fail(c, job, spec, excluded, exc, now=now)
        c.save(job)
        return False
    if job.message.startswith("restart waiting"):
        waited = now - (job.restarting_since_unix_s or now)
        job.message = f"restarted after waiting {waited:.0f} s for devices"
    shrunk = replace_spec_ranks(spec, len(placement.ranks))
    first = initial_plan(shrunk, placement, peerlinks.between(c.state, placement))
    _replace(c, job, placement, first, now=now)
    log.info(
        "job %s attempt %d placed: %d ranks, port %d",
        job.id,
        job.restarts,
        len(placement.ranks),
        placement.master_port,
    )
    return True


def _place_restart(
    c: Cluster, spec: JobSpec, excluded: Sequence[exclusion.Excluded], *, now: float
) -> Placement:
    """The largest placement of ``spec`` on the healthy devices (never another global
    batch), none of them a device left out of the job."""
    devices = exclusion.devices_without(c.devices(now), excluded)
    rules = c.rules
    port = next(c.state.free_ports(rules.master_port_base, rules.master_port_span), None)
    if port is None:
        raise PortsExhaustedError(
            f"every rendezvous port {rules.master_port_base}-"
            f"{rules.master_port_base + rules.master_port_span - 1} is held by a placed job"
        )
    first_error: PlacementError | None = None
    for world_size in lifecycle.restart_world_sizes(spec.world_size):
        try:
            return place(replace_spec_ranks(spec, world_size), devices, port)
        except PlacementError as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


def _wait_or_fail(
    c: Cluster,
    job: Job,
    spec: JobSpec,
    excluded: Sequence[exclusion.Excluded],
    exc: HeteroError,
    *,
    now: float,
) -> None:
    devices = exclusion.devices_without(c.devices(now), excluded)
    smallest = replace_spec_ranks(spec, min(lifecycle.restart_world_sizes(spec.world_size)))
    try:
        admission.check_fits(smallest, devices)
    except HeteroError as never:
        log.warning("job %s cannot restart: %s", job.id, never)
        t = lifecycle.Transition(lifecycle.FAILED, f"cannot restart: {never}")
        c.transition(job, t, now=now)
        return
    if isinstance(exc, PlacementError):
        why = f"restart {admission.reason(smallest, devices, set())}"
    else:  # every rendezvous port held
        why = "restart waiting for a free rendezvous port"
    if job.message == why:
        return
    if not job.message.startswith("restart waiting"):
        c.event("job_restart_waiting", f"job {job.name} {why}", now=now, job=job)
    log.info("job %s %s", job.id, why)
    job.message = why


def _replace(c: Cluster, job: Job, placement: Placement, plan: InitialPlan, *, now: float) -> None:
    """Start the job's next attempt on ``placement``: new ranks, rendezvous and plan.
    ``restarts`` counts attempts placed after the first, so while the job is
    RESTARTING it still names the attempt whose ranks are being stopped."""
    job.restarts += 1
    c._set_ranks(job, placement, now=now)
    job.state, job.restarting_since_unix_s = lifecycle.PENDING, None
    version = c.new_plan(job, plan.batches, 0, plan.policy, plan.reason, now=now).version
    job.attempt_first_plan = version
    job.history.clear()
    job.latest, job.start_up_s = None, None
    names = sorted({c.state.nodes[r.node_id].name for r in job.ranks})
    batches = ",".join(str(b) for b in plan.batches)
    c.event(
        "job_restarted",
        f"job {job.name} attempt {job.restarts}: {job.world_size} ranks on "
        f"{', '.join(names)}, plan v{version} {batches}, resuming from its checkpoint",
        now=now,
        job=job,
    )
    c.capacity += 1
    c.save(job)


def _status(r: Rank, message: str = "") -> lifecycle.RankStatus:
    return lifecycle.RankStatus(r.rank, r.state, r.exit_code, message)


def replace_spec_ranks(spec: JobSpec, world_size: int) -> JobSpec:
    """``spec`` with ``world_size`` ranks (the first ranks' emulated slowdowns kept).

    The global batch stays the one the job started with, also when the file gave a
    per-rank ``batch_size``: the gradient and the learning rate's meaning must not
    change across a restart."""
    if world_size == spec.world_size:
        return spec
    options = spec.options.replace(global_batch=spec.global_batch, batch_size=None)
    return dataclasses.replace(
        spec,
        resources=dataclasses.replace(spec.resources, ranks=world_size),
        options=options,
        emulate_slowdown=spec.emulate_slowdown[:world_size],
    )
