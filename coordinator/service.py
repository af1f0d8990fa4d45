"""The Coordinator gRPC servicer: each RPC is one session and one transaction.

Errors leave as status codes: a ``HeteroError`` aborts with its ``grpc_code``
and message; anything else is logged with its traceback and aborts INTERNAL,
so a client never sees UNKNOWN.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import lifecycle, rebalance, recovery, store, validate, views, wire
from hetero.coordinator.ingest import HeartbeatIngest
from hetero.coordinator.jobspec import JobSpec, parse_jobspec
from hetero.coordinator.models import JobRow
from hetero.coordinator.placement import place, predict
from hetero.coordinator.readcache import (
    IntervalHistories,
    LatestPlans,
    PendingOrders,
    with_interval,
)
from hetero.core import defaults
from hetero.core.balancer import Constraints, DeviceProfile, RankInterval
from hetero.core.errors import ConfigError, HeteroError
from hetero.core.states import JobState, RankState
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.coordinator")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.ServicerContext], Resp]

#: Largest Probe reply, in bytes: below gRPC's default 4 MiB message limit.
MAX_PROBE_BYTES = 4 * 1024 * 1024 - 1024


@dataclass(frozen=True)
class Deps:
    """What the servicer needs from its process: the database and the clock.

    ``readers`` (``database.read_session_factory``) serves the handlers that only
    read; None = ``sessions``. ``ingest`` parks heartbeats and writes them in
    batches; None = each heartbeat is written in its own transaction. ``orders``
    answers most order polls and ``plans`` most ``GetPlan`` calls from memory, and
    ``histories`` keeps each job's recent intervals for its next report
    (``readcache``); None = every call queries.
    """

    sessions: sessionmaker[Session]
    readers: sessionmaker[Session] | None = None
    ingest: HeartbeatIngest | None = None
    orders: PendingOrders | None = None
    plans: LatestPlans | None = None
    histories: IntervalHistories | None = None
    clock: Callable[[], float] = time.time
    heartbeat_interval_s: float = defaults.HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    telemetry: store.TelemetryPolicy = field(default_factory=store.TelemetryPolicy)
    master_port_base: int = defaults.MASTER_PORT_BASE
    master_port_span: int = defaults.MASTER_PORT_SPAN
    #: Set on shutdown: ends WatchCluster streams so a graceful stop does not wait for them.
    stopping: threading.Event = field(default_factory=threading.Event)
    #: Directories jobs' checkpoint.dir and data_dir must lie under (coordinator.roots);
    #: None = only "absolute".
    allowed_roots: tuple[str, ...] | None = None
    #: When this coordinator started (Unix s; None = ``clock()`` at construction):
    #: a node's silence counts from here at most.
    started_at_unix_s: float | None = None

    def __post_init__(self) -> None:
        if self.started_at_unix_s is None:
            object.__setattr__(self, "started_at_unix_s", self.clock())

    def sweep_config(self) -> recovery.SweepConfig:
        return recovery.SweepConfig(
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            started_at=self.started_at_unix_s or 0.0,
            master_port_base=self.master_port_base,
            master_port_span=self.master_port_span,
        )

    def invalidate_caches(self) -> None:
        """Drop the order and plan caches: a write just changed what polls and
        ``GetPlan`` answer (a submission, a cancel, a rank's exit, a restart placed by
        the sweeper or by the last old rank's exit: a new plan and new launches)."""
        if self.orders is not None:
            self.orders.invalidate()
        if self.plans is not None:
            self.plans.invalidate()
        if self.histories is not None:
            self.histories.invalidate()


def abort_for(context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
    """Abort the call with ``exc``'s status (a ``HeteroError``'s own code, else INTERNAL
    naming the method and the exception type, logged with its traceback)."""
    if isinstance(exc, HeteroError):
        code = getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.FAILED_PRECONDITION)
        context.abort(code, str(exc))
    log.exception("internal error in %s", method)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}")


def rpc(method: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Map exceptions of a unary handler to status codes."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Req, context: grpc.ServicerContext) -> Resp:
        try:
            return method(self, request, context)
        except Exception as exc:
            abort_for(context, exc, method.__name__)
            raise  # unreachable: abort raises

    return wrapper


def _invalid(message: str) -> ConfigError:
    return ConfigError(message)


class CoordinatorService(pb_grpc.CoordinatorServicer):  # type: ignore[misc, unused-ignore]
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._read = deps.readers or deps.sessions

    # ---- agents -------------------------------------------------------------

    @rpc
    def RegisterNode(
        self, req: pb.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> pb.RegisterNodeResponse:
        if not req.name or not req.address:
            raise _invalid("RegisterNode needs name and address")
        indexes = [d.index for d in req.devices]
        if len(set(indexes)) != len(indexes):
            raise _invalid(f"node {req.name}: duplicate device indexes {indexes}")
        for d in req.devices:
            if not (d.compute_score > 0 and math.isfinite(d.compute_score)):
                raise _invalid(f"node {req.name} device {d.index}: compute_score must be > 0")
        validate.register_node(req)
        with self.deps.sessions.begin() as s:
            node = store.register_node(
                s,
                name=req.name,
                address=req.address,
                agent_endpoint=req.agent_endpoint,
                agent_version=req.agent_version,
                devices=[wire.device_row(d) for d in req.devices],
                now=self.deps.clock(),
            )
            node_id = node.id
        if self.deps.ingest is not None:
            self.deps.ingest.known(node_id)
        emulated = {d.emulated_slowdown for d in req.devices if d.emulated_slowdown > 1.0}
        log.info(
            "node %s registered as %s with %d devices%s%s",
            req.name,
            node_id,
            len(indexes),
            f", EMULATED slowdown {max(emulated):g}x" if emulated else "",
            _host_summary(req.host) if req.HasField("host") else "",
        )
        return pb.RegisterNodeResponse(
            node_id=node_id,
            heartbeat_interval_s=self.deps.heartbeat_interval_s,
            heartbeat_timeout_s=self.deps.heartbeat_timeout_s,
        )

    @rpc
    def Heartbeat(
        self, req: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatResponse:
        sampled_at = req.sampled_at_unix_s if req.HasField("sampled_at_unix_s") else None
        if sampled_at is not None and not math.isfinite(sampled_at):
            # Checked before parking: a NaN would fail the whole batch at the flush.
            raise _invalid(f"sampled_at_unix_s must be a finite time, got {sampled_at}")
        if self.deps.ingest is not None:
            beat = store.Beat(req.node_id, self.deps.clock(), (), sampled_at=sampled_at)
            self.deps.ingest.offer(beat, lambda: wire.telemetry_values(req))
        else:
            beat = store.Beat(
                req.node_id, self.deps.clock(), wire.telemetry_values(req), sampled_at=sampled_at
            )
            with self.deps.sessions.begin() as s:
                if store.record_heartbeats(s, [beat], policy=self.deps.telemetry):
                    raise store.NotFoundError(f"unknown node {req.node_id!r}: register first")
        # The agent polls only when told to: half the calls 1,000 agents make each second.
        orders = self.deps.orders
        return pb.HeartbeatResponse(orders_pending=orders is None or orders.may_have(req.node_id))

    @rpc
    def PollAssignments(
        self, req: pb.PollAssignmentsRequest, context: grpc.ServicerContext
    ) -> pb.PollAssignmentsResponse:
        out = pb.PollAssignmentsResponse()
        ingest, orders = self.deps.ingest, self.deps.orders
        if ingest and orders and ingest.is_known(req.node_id) and not orders.may_have(req.node_id):
            return out  # the common case, once a second per agent: nothing to do
        with self._read() as s:
            store.get_node(s, req.node_id)
            specs: dict[str, JobSpec] = {}
            for rank in store.ranks_to_launch(s, req.node_id):
                job = rank.job
                if job.id not in specs:
                    specs[job.id] = parse_jobspec(job.spec_yaml, source=f"job {job.id}")
                plan = store.latest_plan(s, job.id)
                out.launches.append(wire.launch_message(job, rank, specs[job.id], plan))
            for rank in store.ranks_to_stop(s, req.node_id):
                out.stops.add(
                    job_id=rank.job_id,
                    rank=rank.rank,
                    reason=rank.job.message,
                    attempt=rank.job.restarts,
                )
        return out

    @rpc
    def ReportRankStatus(
        self, req: pb.ReportRankStatusRequest, context: grpc.ServicerContext
    ) -> pb.ReportRankStatusResponse:
        state = _state_name(RankState, req.state, "state")
        if state not in (lifecycle.RUNNING, lifecycle.EXITED):
            raise _invalid(f"rank state must be RUNNING or EXITED, got {state}")
        if state == lifecycle.EXITED and not req.HasField("exit_code"):
            raise _invalid("an EXITED rank needs exit_code")
        now = self.deps.clock()
        with self.deps.sessions.begin() as s:
            job = store.set_rank_status(
                s,
                req.job_id,
                req.rank,
                node_id=req.node_id,
                state=state,
                exit_code=req.exit_code if req.HasField("exit_code") else None,
                now=now,
                attempt=req.attempt,
                message=req.message,
            )
            # The last old rank confirmed stopped: place the restart now, not at the next sweep.
            recovery.replace_if_ready(s, job, self.deps.sweep_config(), now=now)
            reply = pb.ReportRankStatusResponse(job_state=wire.job_state(job.state))
        # After the commit: stop orders for the survivors, a restart's plan and launches.
        self.deps.invalidate_caches()
        return reply

    @rpc
    def AppendJobLogs(
        self, req: pb.AppendJobLogsRequest, context: grpc.ServicerContext
    ) -> pb.AppendJobLogsResponse:
        with self.deps.sessions.begin() as s:
            store.append_logs(s, req.job_id, wire.log_rows(req, self.deps.clock()))
        return pb.AppendJobLogsResponse()

    @rpc
    def Probe(self, req: pb.ProbeRequest, context: grpc.ServicerContext) -> pb.ProbeResponse:
        if not 0 <= req.reply_bytes <= MAX_PROBE_BYTES:
            raise _invalid(f"reply_bytes must be in [0, {MAX_PROBE_BYTES}]")
        return pb.ProbeResponse(payload=bytes(req.reply_bytes))

    # ---- trainers (through their agent) -------------------------------------

    @rpc
    def ReportIntervalStats(
        self, req: tpb.IntervalReport, context: grpc.ServicerContext
    ) -> tpb.ReportIntervalStatsResponse:
        now = self.deps.clock()
        with self.deps.sessions.begin() as s:
            job = store.get_job(s, req.job_id)
            _check_report(req, job)
            rows = wire.interval_rows(req)
            store.add_interval(s, job, req.end_step, req.plan_version, rows, now=now)
            # One history serves straggler detection and the balancer.
            attempt, steps = job.attempt_first_plan, self._history(job, req, rows)
            if steps is None:
                steps = store.interval_steps(s, job, views.HISTORY_FOR_REPORT)
            history = [ranks for _, ranks in steps]
            for flag in views.new_stragglers(history):
                store.add_event(s, "straggler", flag.message, job_id=job.id, now=now)
            plan = store.latest_plan(s, job.id)
            # Re-plan only from an interval of the current attempt that ran the newest
            # plan: a trainer applies an answer one interval late (trainer/control.py), and
            # an interval of the plan before says nothing new; re-planning on it would
            # store a duplicate.
            if (
                req.plan_version >= job.attempt_first_plan
                and job.state not in lifecycle.FINISHED
                and req.plan_version >= plan.version
                and rebalance.is_boundary(req.end_step, job.rebalance_interval)
            ):
                history = history[-rebalance.HISTORY_WINDOW :]
                profiles = [
                    DeviceProfile(r.device_name, r.effective_score, None, r.emulated_slowdown)
                    for r in job.ranks
                ]
                constraints = Constraints(job.global_batch, job.world_size, job.min_batch)
                result = rebalance.replan(
                    job.policy,
                    history,
                    _running_plan(req, job) or store.plan_batches(plan),
                    constraints,
                    profiles,
                    req.end_step,
                )
                if result.decision.changed:
                    plan = store.add_plan(
                        s,
                        job.id,
                        result.decision.batches,
                        result.apply_at_step,
                        job.policy,
                        result.decision.reason,
                        predicted_step_s=result.decision.predicted_step_s,
                        now=now,
                    )
                    store.add_event(
                        s,
                        "replanned",
                        f"plan v{plan.version}: {plan.batches} ({plan.reason})",
                        job_id=job.id,
                        now=now,
                    )
            reply = wire.plan_message(plan)
        # After the commit: what the next report of this job starts from.
        if self.deps.histories is not None:
            self.deps.histories.put(req.job_id, attempt, steps)
        if self.deps.plans is not None:
            self.deps.plans.put(req.job_id, reply)
        return tpb.ReportIntervalStatsResponse(plan=reply)

    def _history(
        self, job: JobRow, req: tpb.IntervalReport, rows: list[dict[str, Any]]
    ) -> list[tuple[int, list[RankInterval]]] | None:
        """The job's recent complete intervals with this report's (every report is
        complete: ``_check_report``), from memory; None if not cached."""
        if self.deps.histories is None:
            return None
        cached = self.deps.histories.get(job.id, job.attempt_first_plan)
        if cached is None:
            return None
        if req.plan_version < job.attempt_first_plan:
            return cached  # kept in the database, not part of this attempt's history
        ranks = [store.rank_interval(r) for r in rows]
        return with_interval(cached, req.end_step, ranks, views.HISTORY_FOR_REPORT)

    @rpc
    def GetPlan(self, req: tpb.GetPlanRequest, context: grpc.ServicerContext) -> tpb.Plan:
        if self.deps.plans is not None:
            return self.deps.plans.get(req.job_id)
        with self._read() as s:
            return wire.plan_message(store.latest_plan(s, store.get_job(s, req.job_id).id))

    # ---- users ---------------------------------------------------------------

    @rpc
    def SubmitJob(
        self, req: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        # Parse before touching the database: a bad spec stores nothing.
        spec = parse_jobspec(
            req.spec_yaml,
            source=_source_name(req.source_name),
            allowed_roots=self.deps.allowed_roots,
        )
        now = self.deps.clock()
        with self.deps.sessions() as s:
            devices = store.device_slots(s, now=now, timeout_s=self.deps.heartbeat_timeout_s)
            port = store.next_master_port(s, self.deps.master_port_base, self.deps.master_port_span)
            placed = place(spec, devices, port)
            predictions = [wire.prediction_message(p) for p in predict(spec, placed)]
            if req.dry_run:
                job_msg = wire.dry_run_job(spec, req.spec_yaml, placed)
                return pb.SubmitJobResponse(job=job_msg, predictions=predictions)
            job = store.create_job(s, spec, req.spec_yaml, placed, now=now)
            job_msg = self._job(s, job, detail=True)
            s.commit()
        self.deps.invalidate_caches()  # its launches reach the agents at their next poll
        log.info(
            "job %s (%s) submitted: %d ranks, %s",
            job.id,
            spec.name,
            spec.world_size,
            placed.backend,
        )
        return pb.SubmitJobResponse(job_id=job_msg.id, job=job_msg, predictions=predictions)

    @rpc
    def ListJobs(
        self, req: pb.ListJobsRequest, context: grpc.ServicerContext
    ) -> pb.ListJobsResponse:
        states = [_state_name(JobState, st, "states") for st in req.states]
        if req.limit < 0:
            raise _invalid(f"limit must be >= 0, got {req.limit}")
        limit = min(req.limit or 100, 1000)
        with self._read() as s:
            jobs = store.list_jobs(s, states, limit)
            return pb.ListJobsResponse(jobs=[self._job(s, j) for j in jobs])

    @rpc
    def GetJob(self, req: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        with self._read() as s:
            return self._job(s, store.get_job(s, req.job_id), detail=True)

    @rpc
    def CancelJob(self, req: pb.CancelJobRequest, context: grpc.ServicerContext) -> pb.Job:
        with self.deps.sessions.begin() as s:
            job = store.cancel_job(s, req.job_id, now=self.deps.clock())
            reply = self._job(s, job, detail=True)
        self.deps.invalidate_caches()  # its stop orders
        return reply

    @rpc
    def GetJobLogs(
        self, req: pb.GetJobLogsRequest, context: grpc.ServicerContext
    ) -> pb.GetJobLogsResponse:
        limit = min(req.limit or 1000, 10_000)
        with self._read() as s:
            rows = store.job_logs(s, req.job_id, req.after_seq, limit)
            lines = [wire.log_message(r) for r in rows]
        next_seq = lines[-1].seq if lines else req.after_seq
        return pb.GetJobLogsResponse(lines=lines, next_seq=next_seq)

    @rpc
    def ListNodes(
        self, req: pb.ListNodesRequest, context: grpc.ServicerContext
    ) -> pb.ListNodesResponse:
        with self._read() as s:
            return pb.ListNodesResponse(nodes=self._nodes(s))

    @rpc
    def DrainNode(self, req: pb.DrainNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        if not req.node:
            raise _invalid("DrainNode needs a node id or name")
        now = self.deps.clock()
        with self.deps.sessions.begin() as s:
            node = store.set_draining(s, req.node, not req.undrain, now=now)
            healthy = store.is_healthy(node, now, self.deps.heartbeat_timeout_s)
            msg = wire.node_message(node, views.telemetry(s, node.id, self._live()), healthy)
        log.info("node %s %s", msg.name, "drained" if msg.draining else "undrained")
        return msg

    @rpc
    def GetJobDetail(
        self, req: pb.GetJobDetailRequest, context: grpc.ServicerContext
    ) -> pb.JobDetail:
        if req.max_intervals < 0:
            raise _invalid(f"max_intervals must be >= 0, got {req.max_intervals}")
        after = req.after_step if req.HasField("after_step") else None
        with self._read() as s:
            return views.job_detail(s, req.job_id, req.max_intervals, after)

    def WatchCluster(
        self, req: pb.WatchClusterRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ClusterSnapshot]:
        period_s = min(max(req.period_s or 1.0, 0.2), 60.0)
        try:
            while context.is_active() and not self.deps.stopping.is_set():
                yield self.snapshot()
                self.deps.stopping.wait(period_s)
        except Exception as exc:
            abort_for(context, exc, "WatchCluster")

    # ---- shared reads ----------------------------------------------------------

    def _job(self, s: Session, job: JobRow, detail: bool = False) -> pb.Job:
        return views.job_message(s, job, detail)

    def _live(self) -> views.Live | None:
        return self.deps.ingest.current if self.deps.ingest is not None else None

    def _nodes(self, s: Session) -> list[pb.Node]:
        return views.nodes(
            s, now=self.deps.clock(), timeout_s=self.deps.heartbeat_timeout_s, live=self._live()
        )

    def snapshot(self) -> pb.ClusterSnapshot:
        """The cluster now: what WatchCluster streams and the metrics endpoint exports."""
        with self._read() as s:
            return views.cluster_snapshot(
                s,
                now=self.deps.clock(),
                timeout_s=self.deps.heartbeat_timeout_s,
                live=self._live(),
            )


def _running_plan(req: tpb.IntervalReport, job: JobRow) -> tuple[int, ...] | None:
    """The batches the ranks actually ran in the reported interval, if they form a plan.

    A trainer that lost its agent for a while re-plans on its own; comparing the
    next plan with what it really runs (not the last stored plan) keeps the two in step.
    """
    batches = tuple(r.batch for r in sorted(req.ranks, key=lambda r: r.rank))
    valid = len(batches) == job.world_size and all(b >= job.min_batch for b in batches)
    return batches if valid and sum(batches) == job.global_batch else None


def _state_name(states: type[JobState] | type[RankState], value: int, field: str) -> str:
    """``2`` -> ``RUNNING``; a number the enum lacks is INVALID_ARGUMENT."""
    try:
        return states(value).name
    except ValueError:
        raise _invalid(f"{field}: unknown value {value}") from None


def _source_name(name: str) -> str:
    """The client's name for the spec file, as errors show it (one line, short)."""
    clean = " ".join(name.split())[:200]
    return clean or "job.yaml"


def _host_summary(host: tpb.HostProfile) -> str:
    parts = [f"{host.cpu_count} CPUs"] if host.cpu_count else []
    if host.HasField("cpu_gflops"):
        parts.append(f"{host.cpu_gflops:.0f} CPU GFLOP/s")
    if host.HasField("network_rtt_s"):
        parts.append(f"rtt {host.network_rtt_s * 1e3:.2f} ms")
    if host.HasField("network_bytes_per_s"):
        parts.append(f"{host.network_bytes_per_s / 1e6:.0f} MB/s to here")
    return f" ({', '.join(parts)})" if parts else ""


def _check_report(req: tpb.IntervalReport, job: JobRow) -> None:
    """Reject reports the balancer cannot use: wrong rank set, negative or NaN times."""
    ranks = sorted(r.rank for r in req.ranks)
    if ranks != list(range(job.world_size)):
        raise _invalid(f"job {job.id}: report has ranks {ranks}, want 0..{job.world_size - 1}")
    if req.end_step < 0:
        raise _invalid(f"job {job.id}: end_step must be >= 0, got {req.end_step}")
    for r in req.ranks:
        values = (r.compute_s, r.step_s)
        if r.batch < 0 or r.steps < 0 or not all(math.isfinite(v) and v >= 0 for v in values):
            raise _invalid(f"job {job.id} rank {r.rank}: batch, steps and times must be >= 0")
