"""The Coordinator's RPCs, each a coroutine on the event loop that owns the state.

A call is checked against its caller (``scope``), read from the state or changed through
its rules (``cluster``, ``reports``); a call that changed something waits for the
commit of its writes (``Service.commit``) before it answers. What the state does not
keep (log lines, a job's every interval and plan, jobs that ended long ago) is read from
the database on a reading thread (``Service.read``). How a call is checked, refused
and timed is ``calls``'.

A little over the usual ~450 lines: it is the one servicer of the Coordinator service,
a method per RPC, each a few lines that hand the work to the module of its rules
(``cluster``, ``reports``, ``attach``, ``orders``); splitting the servicer would split
one gRPC service across classes for a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from sqlalchemy.orm import Session

from hetero.coordinator import (
    admission,
    attach,
    bounds,
    exclusion,
    jobdirs,
    jobpages,
    lifecycle,
    logwire,
    messages,
    orders,
    peerlinks,
    reports,
    store,
    validate,
    views,
    wire,
)
from hetero.coordinator.calls import (
    STANDBY,
    PermissionDenied,
    invalid,
    rpc,
    state_name,
    stream_bounds,
)
from hetero.coordinator.identity import Caller, Identities
from hetero.coordinator.metrics import RpcLatency
from hetero.coordinator.placement import PlacementError, place, predict
from hetero.coordinator.scope import Scope, denied, own_jobs_only, read_refusal
from hetero.coordinator.service import Service
from hetero.coordinator.state import KEEP_FINISHED_S, ClusterState
from hetero.coordinator.writer import StoreUnavailable
from hetero.core.errors import ConfigError
from hetero.core.jobspec import check_priority, parse_jobspec
from hetero.core.states import JobState, RankState
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.coordinator")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
#: Largest Probe reply, in bytes: below gRPC's default 4 MiB message limit.
MAX_PROBE_BYTES = 4 * 1024 * 1024 - 1024
#: Longest message of a rank's state kept, in characters (an agent's are one short line).
MAX_MESSAGE_CHARS = 1024


class Api(pb_grpc.CoordinatorServicer):  # type: ignore[misc, unused-ignore]
    """Every RPC of ``hetero.v1.Coordinator`` on ``service``."""

    def __init__(self, service: Service, identities: Identities, latency: RpcLatency) -> None:
        self.service = service
        self.identities = identities
        self.latency = latency
        self.scope = Scope(SERVICE_NAME)

    @property
    def cluster(self) -> Any:
        return self.service.cluster

    def _now(self) -> float:
        return self.service.now()

    def _timeout(self) -> float:
        return self.service.settings.heartbeat_timeout_s

    # ---- nodes and their agents ------------------------------------------------------

    @rpc
    async def RegisterNode(
        self, req: pb.RegisterNodeRequest, caller: Caller
    ) -> pb.RegisterNodeResponse:
        validate.register_node(req)
        node = self.cluster.register(
            name=req.name,
            address=req.address,
            agent_endpoint=req.agent_endpoint,
            agent_version=req.agent_version,
            devices=[wire.device(d) for d in req.devices],
            host_profile=req.host if req.HasField("host") else None,
            now=self._now(),
        )
        await self.service.commit()
        emulated = {d.emulated_slowdown for d in req.devices if d.emulated_slowdown > 1.0}
        log.info(
            "node %s registered as %s with %d devices%s%s",
            req.name,
            node.id,
            len(req.devices),
            f", EMULATED slowdown {max(emulated):g}x" if emulated else "",
            _host_summary(req.host) if req.HasField("host") else "",
        )
        settings = self.service.settings
        return pb.RegisterNodeResponse(
            node_id=node.id,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            heartbeat_timeout_s=settings.heartbeat_timeout_s,
            allowed_roots=settings.allowed_roots or (),
        )

    @rpc
    async def Heartbeat(self, req: pb.HeartbeatRequest, caller: Caller) -> pb.HeartbeatResponse:
        buffered = req.HasField("sampled_at_unix_s")
        now = self._now()
        at = min(req.sampled_at_unix_s, now) if buffered else now  # finite: ``bounds``
        node = self.cluster.heartbeat(req.node_id, now)
        if not buffered:
            node.telemetry = req
        self.service.keep_telemetry(node, lambda: wire.telemetry_values(req), at, buffered=buffered)
        self.service.commit_later()
        return pb.HeartbeatResponse()

    @rpc
    async def ReportPeerLinks(
        self, req: pb.ReportPeerLinksRequest, caller: Caller
    ) -> pb.ReportPeerLinksResponse:
        """Links the node measured as its orders asked (``peerlinks``)."""
        peerlinks.report(self.cluster, req.node_id, req.links, now=self._now())
        await self.service.commit()
        return pb.ReportPeerLinksResponse()

    @rpc
    async def ReportRankStatus(
        self, req: pb.ReportRankStatusRequest, caller: Caller
    ) -> pb.ReportRankStatusResponse:
        state = state_name(RankState, req.state, "state")
        if state not in (lifecycle.RUNNING, lifecycle.EXITED):
            raise invalid(f"rank state must be RUNNING or EXITED, got {state}")
        if state == lifecycle.EXITED and not req.HasField("exit_code"):
            raise invalid("an EXITED rank needs exit_code")
        job = self.cluster.rank_status(
            req.job_id,
            req.rank,
            node_id=req.node_id,
            state=state,
            exit_code=req.exit_code if req.HasField("exit_code") else None,
            now=self._now(),
            attempt=req.attempt,
            message=req.message[:MAX_MESSAGE_CHARS],
        )
        await self.service.commit()
        return pb.ReportRankStatusResponse(job_state=wire.job_state(job.state))

    @rpc
    async def AppendJobLogs(
        self, req: pb.AppendJobLogsRequest, caller: Caller
    ) -> pb.AppendJobLogsResponse:
        """Store the lines that fit the log caps; note the rest where they were dropped
        (``logcaps``)."""
        logwire.check_lines(req)
        job = self.service.state.jobs.get(req.job_id)
        owner = (
            job.owner
            if job is not None
            else await self.service.read(lambda s: store.get_job(s, req.job_id).owner)
        )
        settings, now = self.service.settings, self._now()
        op, admitted = logwire.intake(req, owner, self.service.state.logs, settings.log_caps, now)
        await self.service.writer.write(op)
        if (catch_up := logwire.noted(op, admitted)) is not None:
            with contextlib.suppress(StoreUnavailable):  # the lines are in; a reload resets
                self.service.writer.put(catch_up)
        return pb.AppendJobLogsResponse()

    @rpc
    async def Probe(self, req: pb.ProbeRequest, caller: Caller) -> pb.ProbeResponse:
        if not 0 <= req.reply_bytes <= MAX_PROBE_BYTES:
            raise invalid(f"reply_bytes must be in [0, {MAX_PROBE_BYTES}]")
        return pb.ProbeResponse(payload=bytes(req.reply_bytes))

    @rpc
    async def ListNodes(self, req: pb.ListNodesRequest, caller: Caller) -> pb.ListNodesResponse:
        now, timeout = self._now(), self._timeout()
        nodes = sorted(self.service.state.nodes.values(), key=lambda n: n.name)
        return pb.ListNodesResponse(
            nodes=[messages.node_message(n, now=now, timeout_s=timeout) for n in nodes]
        )

    @rpc
    async def DrainNode(self, req: pb.DrainNodeRequest, caller: Caller) -> pb.Node:
        if not req.node:
            raise invalid("DrainNode needs a node id or name")
        node = self.cluster.drain(req.node, not req.undrain, now=self._now())
        await self.service.commit()
        log.info("node %s %s", node.name, "drained" if node.draining else "undrained")
        return messages.node_message(node, now=self._now(), timeout_s=self._timeout())

    # ---- jobs ------------------------------------------------------------------------

    @rpc
    async def SubmitJob(self, req: pb.SubmitJobRequest, caller: Caller) -> pb.SubmitJobResponse:
        """Refuse a spec over the limits or one that can never fit; else queue the job,
        and place it at once when nothing ahead of it waits for its devices."""
        settings = self.service.settings
        admission.check_spec_bytes(req.spec_yaml, settings.limits)  # before the parser sees it
        attach.check_submitted(req.spec_yaml, source_name(req.source_name))
        spec = parse_jobspec(
            req.spec_yaml,
            source=source_name(req.source_name),
            allowed_roots=settings.allowed_roots,
            private=settings.private_paths,
        )
        jobdirs.check_directories(
            spec, caller.label, self.service.state.writers(), source_name(req.source_name)
        )
        priority = req.priority if req.HasField("priority") else spec.priority
        check_priority(priority)
        now = self._now()
        devices = self.cluster.devices(now)
        admission.check_fits(spec, devices)
        if req.dry_run:
            return _dry_run(req, spec, devices, self.service.state)
        admission.check_jobs_per_user(
            caller.label, self.service.state.jobs_of(caller.label), settings.limits
        )
        job, placed = self.cluster.submit(
            spec, req.spec_yaml, now=now, priority=priority, owner=caller.label
        )
        await self.service.commit()
        msg = messages.job_message(self.service.state, job, detail=True)
        log.info(
            "job %s (%s) submitted: %d ranks, %s",
            job.id,
            spec.name,
            spec.world_size,
            msg.backend or f"queued ({msg.message})",
        )
        as_placed = exclusion.spec_without(spec, exclusion.excluded_of(job))
        links = peerlinks.between(self.service.state, placed) if placed else []
        predictions = (
            [wire.prediction_message(p) for p in predict(as_placed, placed, links)]
            if placed
            else []
        )
        return pb.SubmitJobResponse(job_id=job.id, job=msg, predictions=predictions)

    @rpc
    async def AttachJob(self, req: pb.AttachJobRequest, caller: Caller) -> pb.AttachJobResponse:
        """A job its own launcher started, RUNNING with its first plan (``attach``)."""
        settings = self.service.settings
        admission.check_jobs_per_user(
            caller.label, self.service.state.jobs_of(caller.label), settings.limits
        )
        job, plan = attach.attach_job(self.cluster, req, now=self._now(), owner=caller.label)
        await self.service.commit()
        log.info(
            "job %s (%s) attached: %d ranks of %s", job.id, job.name, job.world_size, job.launcher
        )
        return pb.AttachJobResponse(job_id=job.id, plan=messages.plan_message(job.id, plan))

    @rpc
    async def DetachJob(self, req: pb.DetachJobRequest, caller: Caller) -> pb.Job:
        job = attach.detach_job(
            self.cluster, req.job_id, failed=req.failed, message=req.message, now=self._now()
        )
        await self.service.commit()
        return messages.job_message(self.service.state, job)

    @rpc
    async def ListJobs(self, req: pb.ListJobsRequest, caller: Caller) -> pb.ListJobsResponse:
        """A page of jobs, newest first, from the database; those the coordinator holds are
        shown as it holds them (``jobpages``)."""
        states = [state_name(JobState, st, "states") for st in req.states]
        limit = jobpages.page_limit(req.limit)
        after = jobpages.decode(req.page_token)
        held = frozenset(self.service.state.jobs)
        owner = own_jobs_only(caller)

        def page(s: Session) -> tuple[list[str], dict[str, pb.Job], str, int]:
            jobs = store.list_jobs(s, states, limit + 1, after, owner)  # one more: a next?
            rows = jobs[:limit]
            token = jobpages.encode(rows[-1]) if len(jobs) > limit else ""
            others = views.job_messages(s, [j for j in rows if j.id not in held])
            return (
                [j.id for j in rows],
                {m.id: m for m in others},
                token,
                store.count_jobs(s, states, owner),
            )

        ids, stored, token, total = await self.service.read(page)
        state = self.service.state
        jobs = [
            messages.job_message(state, state.jobs[i]) if i in state.jobs else stored[i]
            for i in ids
            if i in state.jobs or i in stored
        ]
        return pb.ListJobsResponse(jobs=jobs, next_page_token=token, total=total)

    @rpc
    async def GetJob(self, req: pb.GetJobRequest, caller: Caller) -> pb.Job:
        job = self.service.state.jobs.get(req.job_id)
        if job is not None:
            return messages.job_message(self.service.state, job, detail=True)
        return await self.service.read(
            lambda s: views.job_message(s, _readable(s, caller, req.job_id), detail=True)
        )

    @rpc
    async def CancelJob(self, req: pb.CancelJobRequest, caller: Caller) -> pb.Job:
        if req.job_id in self.service.state.jobs:
            job = self.cluster.cancel(req.job_id, now=self._now())
            await self.service.commit()
            return messages.job_message(self.service.state, job, detail=True)

        def stored(s: Session) -> pb.Job:  # a job that ended long ago
            row = store.get_job(s, req.job_id)
            who = caller.named
            if who is not None and who.kind == "user" and row.owner != who.label:
                owner = row.owner or "an earlier coordinator's caller"
                raise PermissionDenied(
                    denied(caller, f"cancel job {row.id} (submitted by {owner})")
                )
            if row.state != lifecycle.CANCELLED:
                lifecycle.check_cancellable(row.id, row.state)
            return views.job_message(s, row, detail=True)

        return await self.service.read(stored)

    @rpc
    async def GetJobLogs(self, req: pb.GetJobLogsRequest, caller: Caller) -> pb.GetJobLogsResponse:
        limit = min(req.limit or 1000, 10_000)

        def lines(s: Session) -> list[pb.LogLine]:
            _readable(s, caller, req.job_id)
            return logwire.log_page(store.job_logs(s, req.job_id, req.after_seq, limit))

        found = await self.service.read(lines)
        next_seq = found[-1].seq if found else req.after_seq
        return pb.GetJobLogsResponse(lines=found, next_seq=next_seq)

    @rpc
    async def GetJobDetail(self, req: pb.GetJobDetailRequest, caller: Caller) -> pb.JobDetail:
        if req.max_intervals < 0:
            raise invalid(f"max_intervals must be >= 0, got {req.max_intervals}")
        after = req.after_step if req.HasField("after_step") else None

        def read(s: Session) -> pb.JobDetail:
            _readable(s, caller, req.job_id)
            return views.job_detail(s, req.job_id, req.max_intervals, after)

        detail = await self.service.read(read)
        job = self.service.state.jobs.get(req.job_id)
        if job is not None:
            detail.job.CopyFrom(messages.job_message(self.service.state, job, detail=True))
        return detail

    # ---- plans -----------------------------------------------------------------------

    @rpc
    async def ReportIntervalStats(
        self, req: tpb.IntervalReport, caller: Caller
    ) -> tpb.ReportIntervalStatsResponse:
        bounds.clear_diverged(req)
        job = self.service.state.jobs.get(req.job_id)
        before = (job.plan, job.state) if job is not None else None
        plan = reports.handle(self.cluster, req, self._now())
        if job is not None and before == (plan, job.state):
            # Nothing the rank is told waits on the disk: the interval's rows and events
            # are written with the next batch (a crash loses at most that batch's).
            self.service.commit_later()
        else:  # a new plan or a restart: durable before anyone acts on it
            await self.service.commit()
        return tpb.ReportIntervalStatsResponse(plan=messages.plan_message(req.job_id, plan))

    @rpc
    async def GetPlan(self, req: tpb.GetPlanRequest, caller: Caller) -> tpb.Plan:
        job = self.service.state.jobs.get(req.job_id)
        if job is not None and job.plan is not None:
            return messages.plan_message(job.id, job.plan)
        return await self.service.read(
            lambda s: wire.plan_message(store.latest_plan(s, store.get_job(s, req.job_id).id))
        )

    async def WatchOrders(
        self, req: pb.WatchOrdersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.Orders]:
        """The node's orders, each sent once and once committed: all of them first, then
        each change (``orders``). Ends when the coordinator stops or the client leaves."""
        if not self.service.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STANDBY)
        await stream_bounds(context, "WatchOrders", req)
        caller = self.identities.of(context.invocation_metadata(), context.auth_context())
        refused = self.scope.check(self.service.state, caller, "WatchOrders", req)
        if refused is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        if req.node_id not in self.service.state.nodes:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown node {req.node_id!r}: register first"
            )
        try:
            probe = peerlinks.endpoint(req)
        except ConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.service.state.nodes[req.node_id].peer_probe = probe
        stream = orders.OrderStream(req.node_id)
        changed = self.service.watch(req.node_id)
        try:
            while not self.service.stopping.is_set():
                changed.clear()
                new = stream.new(self.service.state, self._now())
                if new:
                    try:
                        await self.service.writer.barrier()  # what it orders is committed
                    except StoreUnavailable:
                        continue  # the state was reloaded: look again
                    for msg in new:
                        yield msg
                await self.service.until(changed)
        finally:
            self.service.unwatch(req.node_id, changed)
            node = self.service.state.nodes.get(req.node_id)
            if node is not None and node.peer_probe is probe:  # not a newer stream's
                node.peer_probe = None

    # ---- the cluster view ------------------------------------------------------------

    async def WatchCluster(
        self, req: pb.WatchClusterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ClusterSnapshot]:
        if not self.service.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STANDBY)
        await stream_bounds(context, "WatchCluster", req)
        caller = self.identities.of(context.invocation_metadata(), context.auth_context())
        refused = self.scope.method_refusal(caller, "WatchCluster")
        if refused is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        period_s = min(max(req.period_s or 1.0, 0.2), 60.0)
        stopping = self.service.stopping
        owner = own_jobs_only(caller)
        while not stopping.is_set():
            yield self.snapshot(owner)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), period_s)

    def snapshot(self, owner: str | None = None) -> pb.ClusterSnapshot:
        """The cluster now, from memory (on the event loop); with ``owner``, that owner's
        jobs alone (``scope.own_jobs_only``)."""
        return messages.snapshot(
            self.service.state,
            now=self._now(),
            timeout_s=self._timeout(),
            finished_s=KEEP_FINISHED_S,
            owner=owner,
        )


def _dry_run(
    req: pb.SubmitJobRequest,
    spec: Any,
    devices: list[Any],
    state: ClusterState,
) -> pb.SubmitJobResponse:
    """What a submission would do, storing nothing: the placement it gets now, or the one
    it would get on the idle cluster and why it would wait; its predictions count the
    links measured among its nodes (``peerlinks``)."""
    waits = ""
    try:
        placed = place(spec, devices, 0)
    except PlacementError:
        waits = "would queue: " + admission.reason(spec, devices, set())
        placed = place(spec, admission.idle(devices), 0)
    links = peerlinks.between(state, placed)
    job_msg = wire.dry_run_job(spec, req.spec_yaml, placed, links)
    if (note := exclusion.profile_note(spec, placed)) is not None:
        waits = f"{waits}; {note}" if waits else note
    job_msg.message = waits
    predictions = [wire.prediction_message(p) for p in predict(spec, placed, links)]
    return pb.SubmitJobResponse(job=job_msg, predictions=predictions)


def _readable(s: Session, caller: Caller, job_id: str) -> Any:
    """The stored row of job ``job_id`` if ``caller`` may read it (``scope``: the state's
    jobs were checked before the handler; these are the others)."""
    row = store.get_job(s, job_id)
    refused = read_refusal(caller, row.id, row.owner)
    if refused is not None:
        raise PermissionDenied(refused)
    return row


def source_name(name: str) -> str:
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
