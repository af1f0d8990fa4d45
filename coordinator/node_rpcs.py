"""The Coordinator RPCs of nodes: their agents register, heartbeat, poll for orders,
report their ranks' states and ship logs; users list and drain nodes."""

from __future__ import annotations

import logging
import math

import grpc

from hetero.coordinator import (
    lifecycle,
    logwire,
    orderpages,
    recovery,
    store,
    validate,
    views,
    wire,
)
from hetero.coordinator.rpc import Handlers, invalid, rpc, state_name, time_left
from hetero.core.states import RankState
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.coordinator")

#: Largest Probe reply, in bytes: below gRPC's default 4 MiB message limit.
MAX_PROBE_BYTES = 4 * 1024 * 1024 - 1024


class NodeHandlers(Handlers):
    """RegisterNode, Heartbeat, PollAssignments, ReportRankStatus, AppendJobLogs,
    Probe (agents); ListNodes, DrainNode (users)."""

    @rpc
    def RegisterNode(
        self, req: pb.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> pb.RegisterNodeResponse:
        if not req.name or not req.address:
            raise invalid("RegisterNode needs name and address")
        indexes = [d.index for d in req.devices]
        if len(set(indexes)) != len(indexes):
            raise invalid(f"node {req.name}: duplicate device indexes {indexes}")
        for d in req.devices:
            if not (d.compute_score > 0 and math.isfinite(d.compute_score)):
                raise invalid(f"node {req.name} device {d.index}: compute_score must be > 0")
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
            # New devices (a node joining or back): the queue may move now.
            moved = store.admit_queued(s, self.deps.sweep_config().queue, now=self.deps.clock())
        if moved:
            self.deps.invalidate_caches()
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
            raise invalid(f"sampled_at_unix_s must be a finite time, got {sampled_at}")
        if self.deps.ingest is not None:
            beat = store.Beat(req.node_id, self.deps.clock(), (), sampled_at=sampled_at)
            self.deps.ingest.offer(beat, req)
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
            return orderpages.poll_page(
                s, req.node_id, req.page_token, req.limit, lambda: time_left(context)
            )

    @rpc
    def ReportRankStatus(
        self, req: pb.ReportRankStatusRequest, context: grpc.ServicerContext
    ) -> pb.ReportRankStatusResponse:
        state = state_name(RankState, req.state, "state")
        if state not in (lifecycle.RUNNING, lifecycle.EXITED):
            raise invalid(f"rank state must be RUNNING or EXITED, got {state}")
        if state == lifecycle.EXITED and not req.HasField("exit_code"):
            raise invalid("an EXITED rank needs exit_code")
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
            cfg = self.deps.sweep_config()
            recovery.replace_if_ready(s, job, cfg, now=now)
            if job.state in lifecycle.FINISHED:  # its devices are free: the queue moves now
                s.flush()
                recovery.place_waiting(s, cfg, now=now)
            reply = pb.ReportRankStatusResponse(job_state=wire.job_state(job.state))
        # After the commit: stop orders for the survivors, a restart's plan and launches.
        self.deps.invalidate_caches()
        return reply

    @rpc
    def AppendJobLogs(
        self, req: pb.AppendJobLogsRequest, context: grpc.ServicerContext
    ) -> pb.AppendJobLogsResponse:
        with self.deps.sessions.begin() as s:
            store.append_logs(s, req.job_id, logwire.log_rows(req, self.deps.clock()))
        return pb.AppendJobLogsResponse()

    @rpc
    def Probe(self, req: pb.ProbeRequest, context: grpc.ServicerContext) -> pb.ProbeResponse:
        if not 0 <= req.reply_bytes <= MAX_PROBE_BYTES:
            raise invalid(f"reply_bytes must be in [0, {MAX_PROBE_BYTES}]")
        return pb.ProbeResponse(payload=bytes(req.reply_bytes))

    @rpc
    def ListNodes(
        self, req: pb.ListNodesRequest, context: grpc.ServicerContext
    ) -> pb.ListNodesResponse:
        with self._read() as s:
            return pb.ListNodesResponse(nodes=self._nodes(s))

    @rpc
    def DrainNode(self, req: pb.DrainNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        if not req.node:
            raise invalid("DrainNode needs a node id or name")
        now = self.deps.clock()
        with self.deps.sessions.begin() as s:
            node = store.set_draining(s, req.node, not req.undrain, now=now)
            s.flush()
            moved = store.admit_queued(s, self.deps.sweep_config().queue, now=now)
            healthy = store.is_healthy(node, now, self.deps.heartbeat_timeout_s)
            msg = wire.node_message(node, views.telemetry(s, node.id, self._live()), healthy)
        if moved:  # undrained: queued jobs placed on it
            self.deps.invalidate_caches()
        log.info("node %s %s", msg.name, "drained" if msg.draining else "undrained")
        return msg


def _host_summary(host: tpb.HostProfile) -> str:
    parts = [f"{host.cpu_count} CPUs"] if host.cpu_count else []
    if host.HasField("cpu_gflops"):
        parts.append(f"{host.cpu_gflops:.0f} CPU GFLOP/s")
    if host.HasField("network_rtt_s"):
        parts.append(f"rtt {host.network_rtt_s * 1e3:.2f} ms")
    if host.HasField("network_bytes_per_s"):
        parts.append(f"{host.network_bytes_per_s / 1e6:.0f} MB/s to here")
    return f" ({', '.join(parts)})" if parts else ""
