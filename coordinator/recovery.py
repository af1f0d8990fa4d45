"""Failure detection and job recovery: the coordinator's sweeper.

Every ``period_s`` the sweeper, in one transaction:

1. marks a node DOWN once it has been silent for longer than the heartbeat
   timeout (one ``node_down`` event per outage; the node's next heartbeat or
   registration records ``node_up``), and restarts or fails every job that had
   ranks there (``lifecycle.node_lost``);
2. gives a RESTARTING job whose old ranks are all gone its next placement on
   the healthy devices: the spec's world size if it fits, else fewer ranks
   (same global batch), a fresh rendezvous port, a new plan; the agents then
   launch it with ``--resume auto``. A restart that fits nowhere now waits
   RESTARTING with the reason, ahead of every queued job (the devices it may use
   are held for it), and is placed by a later sweep; one that could never fit
   the registered devices left to it fails;
3. places the queued jobs that now fit (``store.admit_queued``): restarts go
   first, since their jobs were running already.

A coordinator that just started counts silence from its own start, not from the
last heartbeat stored: agents need a moment to reconnect after its restart.
Ranks that an agent never confirms stopped (it hangs but still heartbeats) are
given up on after ``stop_timeout_s``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import admission, exclusion, lifecycle, store, views
from hetero.coordinator.capacity import CapacityWatch
from hetero.coordinator.models import JobRow
from hetero.coordinator.periodic import Periodic
from hetero.coordinator.placement import Placement, PlacementError, initial_plan, place
from hetero.core import defaults
from hetero.core.errors import HeteroError
from hetero.core.jobspec import JobSpec, parse_jobspec

log = logging.getLogger("hetero.coordinator.recovery")

#: Seconds a restarting job waits for its agents to confirm the old ranks stopped.
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SweepConfig:
    """Seconds. ``started_at`` is when this coordinator process started (Unix s)."""

    heartbeat_timeout_s: float
    started_at: float
    master_port_base: int = defaults.MASTER_PORT_BASE
    master_port_span: int = defaults.MASTER_PORT_SPAN
    stop_timeout_s: float = STOP_TIMEOUT_S
    #: Ranks of active jobs one CPU device may run (``admission.Limits``).
    ranks_per_cpu_device: int = admission.Limits.ranks_per_cpu_device

    @property
    def queue(self) -> store.QueueConfig:
        return store.QueueConfig(
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            ranks_per_cpu_device=self.ranks_per_cpu_device,
            master_port_base=self.master_port_base,
            master_port_span=self.master_port_span,
        )


def sweep(s: Session, cfg: SweepConfig, *, now: float, admit: bool = True) -> bool:
    """One pass: detect down nodes, re-place the restarting jobs that can be, then place
    the queued jobs that fit (``admit``: the queue's pass; it runs anyway if this sweep
    marked a node down or placed a restart).

    True if it changed anything the agents' polls or ``GetPlan`` answer (a node
    lost: stop orders; a restart or queued job placed, or a restart failed:
    launches, a new plan)."""
    changed = False
    if now - cfg.started_at > cfg.heartbeat_timeout_s:
        for node in store.silent_nodes(s, since=now - cfg.heartbeat_timeout_s):
            silent_s = now - node.last_heartbeat_unix_s
            store.mark_down(s, node, silent_s, now=now)
            log.warning("node %s down: no heartbeat for %.1f s", node.name, silent_s)
            store.lose_node(s, node, now=now)
            changed = True
    s.flush()
    return place_waiting(s, cfg, now=now, admit=admit or changed) or changed


def place_waiting(s: Session, cfg: SweepConfig, *, now: float, admit: bool = True) -> bool:
    """Place what waits for devices: the restarts first, then, with ``admit`` or after a
    restart moved, the queued jobs that fit. True if a job was placed or failed."""
    changed = False
    for job in store.restarting_jobs(s):
        if replace_if_ready(s, job, cfg, now=now) or job.state != lifecycle.RESTARTING:
            changed = True
    s.flush()
    if (admit or changed) and store.admit_queued(s, cfg.queue, now=now):  # placements made
        changed = True
    return changed


def replace_if_ready(s: Session, job: JobRow, cfg: SweepConfig, *, now: float) -> bool:
    """Place a RESTARTING job's next attempt once its old ranks are gone; True if placed."""
    if job.state != lifecycle.RESTARTING:
        return False
    statuses = [lifecycle.RankStatus(r.rank, r.state, r.exit_code) for r in job.ranks]
    if not lifecycle.ready_to_replace(statuses):
        since = job.restarting_since_unix_s or now
        if now - since < cfg.stop_timeout_s:
            return False
        stuck = [r.rank for r in job.ranks if r.state != lifecycle.EXITED]
        store.add_event(
            s,
            "ranks_unconfirmed",
            f"job {job.name}: ranks {stuck} not confirmed stopped after "
            f"{cfg.stop_timeout_s:.0f} s; placing the restart anyway",
            job_id=job.id,
            now=now,
        )
        for r in job.ranks:
            r.state = lifecycle.EXITED
    spec = parse_jobspec(job.spec_yaml, source=f"job {job.id}")
    # The attempt that ended measured its ranks with each other: its forecast holds only
    # while all their nodes are up (a lost one changes who would take the rank's samples).
    if all(not r.node.down for r in job.ranks) and (
        decision := exclusion.measured(
            spec, job, store.interval_history(s, job, views.HISTORY_FOR_REPORT)
        )
    ):
        exclusion.record(job, decision.entry)
        store.add_event(s, "rank_excluded", decision.message, job_id=job.id, now=now)
    excluded = exclusion.excluded_of(job)
    spec = exclusion.spec_without(spec, excluded)
    try:
        placement = place_restart(s, spec, cfg, now=now, excluded=excluded)
    except HeteroError as exc:
        wait_or_fail(s, job, spec, excluded, cfg, exc, now=now)
        return False
    if job.message.startswith("restart waiting"):
        waited = now - (job.restarting_since_unix_s or now)
        job.message = f"restarted after waiting {waited:.0f} s for devices"
    shrunk = replace_spec_ranks(spec, len(placement.ranks))
    store.replace_job(s, job, placement, initial_plan(shrunk, placement), now=now)
    log.info(
        "job %s attempt %d placed: %d ranks, port %d",
        job.id,
        job.restarts,
        len(placement.ranks),
        placement.master_port,
    )
    return True


def wait_or_fail(
    s: Session,
    job: JobRow,
    spec: JobSpec,
    excluded: Sequence[exclusion.Excluded],
    cfg: SweepConfig,
    exc: HeteroError,
    *,
    now: float,
) -> None:
    """A restart that fits nowhere now: it waits RESTARTING, with the reason, ahead of
    the queue (its devices held, ``store.held_for_restarts``), unless even its smallest
    placement could never fit the registered devices left to it: then the job fails."""
    devices = exclusion.devices_without(
        store.device_slots(
            s, now=now, timeout_s=cfg.heartbeat_timeout_s, cpu_capacity=cfg.ranks_per_cpu_device
        ),
        excluded,
    )
    smallest = replace_spec_ranks(spec, min(lifecycle.restart_world_sizes(spec.world_size)))
    try:
        admission.check_fits(smallest, devices)
    except HeteroError as never:
        log.warning("job %s cannot restart: %s", job.id, never)
        store.fail_restart(s, job, f"cannot restart: {never}", now=now)
        return
    if isinstance(exc, PlacementError):
        why = f"restart {admission.reason(smallest, devices, set())}"
    else:  # every rendezvous port held
        why = "restart waiting for a free rendezvous port"
    if job.message == why:
        return
    if not job.message.startswith("restart waiting"):
        store.add_event(s, "job_restart_waiting", f"job {job.name} {why}", job_id=job.id, now=now)
    log.info("job %s %s", job.id, why)
    job.message = why


def place_restart(
    s: Session,
    spec: JobSpec,
    cfg: SweepConfig,
    *,
    now: float,
    excluded: Sequence[exclusion.Excluded] = (),
) -> Placement:
    """The largest placement of ``spec`` on the healthy devices (never another global
    batch), none of them a device left out of the job (``excluded``)."""
    devices = store.device_slots(
        s, now=now, timeout_s=cfg.heartbeat_timeout_s, cpu_capacity=cfg.ranks_per_cpu_device
    )
    devices = exclusion.devices_without(devices, excluded)
    port = store.free_port(s, cfg.master_port_base, cfg.master_port_span)
    first_error: PlacementError | None = None
    for world_size in lifecycle.restart_world_sizes(spec.world_size):
        try:
            return place(replace_spec_ranks(spec, world_size), devices, port)
        except PlacementError as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


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


class Sweeper:
    """The thread that runs :func:`sweep` every ``period_s`` until :meth:`stop`.

    ``before`` runs ahead of each sweep (the coordinator flushes its parked
    heartbeats, so a node heard a moment ago is not taken for silent: the
    database's ``last_heartbeat_unix_s`` would lag by up to a flush period);
    ``on_change`` runs after a sweep that changed orders or plans was committed
    (the coordinator drops its read caches, so the launches and the new plan of
    a restart are served at once). The queue's pass runs when ``capacity`` says
    the devices may have changed since the last one (``coordinator.capacity``; default:
    one on ``sessions``, which ``stop`` closes either way). ``admit_elsewhere`` runs that
    pass in another process (``ReportWorkers.admit``: off the interpreter lock the event
    loop needs) and answers whether it placed a job, or None: run it here."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        cfg: SweepConfig,
        period_s: float,
        clock: Callable[[], float] = time.time,
        *,
        before: Callable[[], object] | None = None,
        on_change: Callable[[], None] | None = None,
        capacity: CapacityWatch | None = None,
        admit_elsewhere: Callable[[store.QueueConfig, float], bool | None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.cfg = cfg
        self.period_s = period_s
        self.clock = clock
        self.before = before
        self.on_change = on_change
        self.capacity = capacity or CapacityWatch(sessions)
        self.admit_elsewhere = admit_elsewhere
        self._loop = Periodic("sweeper", period_s, self.sweep_once, failure="sweep failed")

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        self.capacity.close()

    def sweep_once(self) -> None:
        if self.before is not None:
            self.before()
        now = self.clock()
        epoch = self.capacity.due(now)
        elsewhere = self.admit_elsewhere if epoch is not None else None
        with self.sessions.begin() as s:
            changed = sweep(s, self.cfg, now=now, admit=epoch is not None and elsewhere is None)
        if elsewhere is not None:
            placed = elsewhere(self.cfg.queue, now)
            if placed is None:
                with self.sessions.begin() as s:
                    placed = bool(store.admit_queued(s, self.cfg.queue, now=now))
            changed = changed or placed
        if epoch is not None:
            self.capacity.passed(epoch, now)
        if changed and self.on_change is not None:
            self.on_change()
