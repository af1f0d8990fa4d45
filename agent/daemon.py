"""The agent process's wiring: register, heartbeat, poll orders, supervise ranks, ship logs.

One loop thread does all talking to the coordinator and all process
management (so ``PR_SET_PDEATHSIG``, which follows the launching thread, holds
for the agent's lifetime). Telemetry samples on its own thread; ``AgentLocal``
serves trainers from gRPC's pool. The coordinator being down at start or later
is never fatal: calls are retried with exponential backoff (capped at half the
heartbeat timeout, so a restarted coordinator hears from every agent before it
would call one down), state reports are queued and delivered in order once it
is back, and interval reports and telemetry wait in a bounded outbox
(``agent.outbox``). Each launch carries its job's attempt number: a rank of an
earlier attempt still running here is stopped before the new one starts, and
reports name the attempt, so the coordinator ignores news of old placements.
The agent polls for orders only after a heartbeat whose reply says some may be
pending (``orders_pending``), not after every heartbeat.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc

from hetero import __version__
from hetero.agent.config import AgentConfig, outbound_address
from hetero.agent.local import AgentLocalService, PlanCache, create_local_server
from hetero.agent.network import CHANNEL_OPTIONS, measure_network
from hetero.agent.nvml import Nvml
from hetero.agent.orders import rank_command, rank_environment
from hetero.agent.outbox import Outbox
from hetero.agent.profile import NodeProfile
from hetero.agent.supervisor import Exit, Line, Supervisor
from hetero.agent.telemetry import TelemetrySampler
from hetero.auth import new_token
from hetero.core.errors import ConfigError, UnknownNameError, UnreachableError, UnsupportedError
from hetero.core.states import job_terminal
from hetero.transport import (
    ClientSecurity,
    client_channel,
    is_unreachable,
    remote_error,
    warn_unverified_coordinator,
)
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.agent")

#: Seconds each coordinator call may take.
CALL_TIMEOUT_S = 5.0
#: Seconds between loop ticks: how soon an exited rank is noticed.
TICK_S = 0.2
#: Log lines per AppendJobLogs call.
LOG_BATCH = 1000


def orders_pending(reply: pb.HeartbeatResponse) -> bool:
    """Whether to poll after this heartbeat: when the coordinator says so, and always
    for one that predates the flag (it leaves it unset)."""
    return not reply.HasField("orders_pending") or reply.orders_pending


@dataclass
class Backoff:
    """Exponential retry delay in seconds: ``initial_s`` doubling up to ``max_s``."""

    initial_s: float = 0.5
    max_s: float = 30.0
    delay_s: float = 0.0
    failures: int = 0

    def failed(self) -> float:
        self.failures += 1
        self.delay_s = min(self.max_s, self.initial_s * 2 ** (self.failures - 1))
        return self.delay_s

    def succeeded(self) -> None:
        self.failures, self.delay_s = 0, 0.0


class Agent:
    """One node's agent. ``run()`` blocks until ``stop()``; both are safe to call from tests."""

    def __init__(
        self,
        config: AgentConfig,
        profile: NodeProfile,
        *,
        nvml: Nvml | None = None,
        clock: Callable[[], float] = time.time,
        security: ClientSecurity | None = None,
    ) -> None:
        self.config = config
        self.profile = replace(profile, emulated_slowdown=config.emulate_slowdown)
        self.clock = clock
        self.state_dir = config.resolved_state_dir
        self.security = security or ClientSecurity()
        self.channel = client_channel(config.coordinator, self.security, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.CoordinatorStub(self.channel)  # type: ignore[no-untyped-call, unused-ignore]
        self.plans = PlanCache()
        self.outbox = Outbox()
        # A secured agent guards AgentLocal with a token of its own, made here and given
        # to its ranks: the coordinator's token never reaches job code.
        self.local_token = new_token() if self.security.secured else None
        self.local_server, self.local_port = create_local_server(
            config.local_listen,
            AgentLocalService(self.stub, self.plans, outbox=self.outbox),
            self.local_token,
            insecure=config.insecure,
        )
        host = config.local_listen.rsplit(":", 1)[0]
        self.endpoint = (
            f"{'127.0.0.1' if host in ('', '0.0.0.0', '[::]') else host}:{self.local_port}"
        )
        self.supervisor = Supervisor(self.state_dir, clock=clock)
        gpus = [d.index for d in self.profile.devices if d.kind == "cuda"]
        cpus = [d.index for d in self.profile.devices if d.kind != "cuda"]
        self.telemetry = TelemetrySampler(nvml or Nvml(), gpus, cpu_indexes=cpus, clock=clock)
        self.node_id: str | None = None
        self.heartbeat_interval_s = 1.0
        self.backoff = Backoff()
        #: (job, rank, attempt) of every launch order carried out.
        self.launched: set[tuple[str, int, int]] = set()
        self.statuses: list[pb.ReportRankStatusRequest] = []
        self._stop = threading.Event()
        self._next_contact = 0.0
        self._unreachable_logged = False

    # ---- lifecycle -----------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.local_server.start()
        self.telemetry.start()
        emu = (
            f", EMULATED slowdown {self.config.emulate_slowdown:g}x"
            if self.profile.emulated
            else ""
        )
        log.info(
            "agent %s: AgentLocal on %s, coordinator %s, state %s%s",
            self.config.node_name,
            self.endpoint,
            self.config.coordinator,
            self.state_dir,
            emu,
        )
        warn_unverified_coordinator(self.config.coordinator, self.security)
        try:
            while not self._stop.is_set():
                now = time.perf_counter()
                if now >= self._next_contact:
                    self._contact()
                self.supervisor.watchdog(self.config.watchdog_s)
                self._reap()
                # The outbox first, once the coordinator answers again: a job's
                # statistics arrive before the news that it ended.
                if self.backoff.failures == 0:
                    self._deliver_outbox()
                if not self.outbox.pending:
                    self._flush_statuses()
                self._ship_logs()
                self._stop.wait(TICK_S)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        """Stop every rank (no orphans), tell the coordinator briefly, close the servers."""
        ended = self.supervisor.stop_all(self.config.stop_grace_s)
        for e in ended:
            self._queue_exit(e, "agent stopped")
        self._flush_statuses(timeout_s=1.0)
        self._ship_logs(timeout_s=1.0)
        self.telemetry.stop()
        self.local_server.stop(0.5).wait()
        self.channel.close()
        log.info("agent stopped")

    # ---- coordinator contact ------------------------------------------------------------
    def _contact(self) -> None:
        try:
            if self.node_id is None:
                self._register()
            self._heartbeat_and_poll()
        except grpc.RpcError as exc:
            if self.node_id is not None and is_unreachable(exc):
                snapshot = self.telemetry.latest()
                self.outbox.keep_telemetry(snapshot.heartbeat(self.node_id), snapshot.time_unix_s)
            self._failed(exc)
            return
        if self._unreachable_logged:
            log.info("coordinator %s reachable again", self.config.coordinator)
            self._unreachable_logged = False
        self.backoff.succeeded()
        self._next_contact = time.perf_counter() + self.heartbeat_interval_s

    def _failed(self, exc: grpc.RpcError) -> None:
        error = remote_error(exc, f"coordinator {self.config.coordinator}")
        if isinstance(error, UnknownNameError) and self.node_id is not None:
            log.warning(
                "coordinator does not know node %s (database reset?): registering again",
                self.node_id,
            )
            self.node_id = None
            self._next_contact = time.perf_counter()
            return
        delay = self.backoff.failed()
        unreachable = isinstance(error, UnreachableError)
        if not self._unreachable_logged or not unreachable:
            log.warning(
                "coordinator %s: %s (%s); retrying in %.1f s",
                self.config.coordinator,
                error.status,
                error,
                delay,
            )
            self._unreachable_logged = unreachable
        self._next_contact = time.perf_counter() + delay

    def _register(self) -> None:
        profile = self.profile
        try:
            net = measure_network(self.stub, timeout_s=CALL_TIMEOUT_S)
            profile = replace(profile, network_rtt_s=net.rtt_s, network_bytes_per_s=net.bytes_per_s)
        except grpc.RpcError as exc:
            if not isinstance(remote_error(exc, "the coordinator"), UnsupportedError):
                raise
        resp = self.stub.RegisterNode(
            pb.RegisterNodeRequest(
                name=self.config.node_name,
                address=self.config.address or outbound_address(self.config.coordinator),
                agent_endpoint=self.endpoint,
                agent_version=__version__,
                devices=profile.device_messages(),
                host=profile.host_message(),
            ),
            timeout=CALL_TIMEOUT_S,
        )
        self.profile = profile
        self.node_id = resp.node_id
        self.heartbeat_interval_s = resp.heartbeat_interval_s or 1.0
        if resp.heartbeat_timeout_s:
            # Retry often enough to be heard within the timeout once the coordinator is back.
            self.backoff.max_s = max(0.5, min(30.0, resp.heartbeat_timeout_s / 2))
        rtt = f"{profile.network_rtt_s * 1e3:.2f} ms" if profile.network_rtt_s else "n/a"
        log.info(
            "registered as node %s (%s), %d device(s), heartbeat every %.1f s, rtt %s%s",
            self.node_id,
            self.config.node_name,
            len(profile.devices),
            self.heartbeat_interval_s,
            rtt,
            f", EMULATED slowdown {profile.emulated_slowdown:g}x" if profile.emulated else "",
        )

    def _heartbeat_and_poll(self) -> None:
        assert self.node_id is not None
        beat = self.stub.Heartbeat(
            self.telemetry.latest().heartbeat(self.node_id), timeout=CALL_TIMEOUT_S
        )
        if not orders_pending(beat):
            return
        orders = self.stub.PollAssignments(
            pb.PollAssignmentsRequest(node_id=self.node_id), timeout=CALL_TIMEOUT_S
        )
        per_job: dict[str, int] = defaultdict(int)
        for order in orders.launches:
            per_job[order.job_id] += 1
        for order in orders.launches:
            if (order.job_id, order.rank, order.attempt) not in self.launched:
                self._launch(order, per_job[order.job_id])
        for stop in orders.stops:
            self._stop_rank(stop)

    # ---- ranks ------------------------------------------------------------------------
    def _threads(self, order: pb.RankLaunch) -> int:
        if order.device_kind == tpb.DEVICE_KIND_CUDA:
            return max(1, (os.cpu_count() or 1) // 8)
        if self.config.cpu_threads:
            return self.config.cpu_threads
        cpu_ranks = 1 + len(self.supervisor.workers)
        return max(1, (os.cpu_count() or 1) // cpu_ranks)

    def _launch(self, order: pb.RankLaunch, local_world_size: int) -> None:
        older = self.supervisor.attempt_of(order.job_id, order.rank)
        if older is not None:
            # A rank of an earlier attempt is still here (this node was cut off while
            # the job restarted): end it first; the order comes again next poll.
            if older < order.attempt:
                self.supervisor.stop(order.job_id, order.rank, self.config.stop_grace_s)
            return
        self.launched.add((order.job_id, order.rank, order.attempt))
        self.plans.offer(order.plan)
        out_dir = self.supervisor.job_dir(order.job_id) / f"rank{order.rank}"
        progress = out_dir / "progress"
        argv = rank_command(order, self.config.python, out_dir)
        try:
            env = rank_environment(
                order,
                agent_endpoint=self.endpoint,
                threads=self._threads(order),
                local_world_size=local_world_size,
                agent_token=self.local_token,
                progress_file=progress,
            )
        except ConfigError as exc:  # a value no rank could read: fail the rank, not the agent
            log.error("job %s rank %d: bad launch order: %s", order.job_id, order.rank, exc)
            self._queue(
                order.job_id,
                order.rank,
                pb.RANK_STATE_EXITED,
                2,
                f"bad launch order: {exc}",
                order.attempt,
            )
            return
        emu = (
            f" (EMULATED slowdown {order.emulated_slowdown:g}x)"
            if order.emulated_slowdown > 1
            else ""
        )
        attempt = order.attempt
        try:
            self.supervisor.launch(
                order.job_id,
                order.rank,
                argv,
                env,
                out_dir,
                attempt=attempt,
                progress_file=progress,
            )
        except OSError as exc:
            log.error("job %s rank %d: cannot start %s: %s", order.job_id, order.rank, argv[0], exc)
            self._queue(
                order.job_id, order.rank, pb.RANK_STATE_EXITED, 127, f"cannot start: {exc}", attempt
            )
            return
        again = f" (attempt {attempt})" if attempt else ""
        log.info(
            "job %s rank %d/%d launched%s%s", order.job_id, order.rank, order.world_size, again, emu
        )
        self._queue(order.job_id, order.rank, pb.RANK_STATE_RUNNING, None, "", attempt)

    def _stop_rank(self, stop: pb.RankStop) -> None:
        if self.supervisor.stop(stop.job_id, stop.rank, self.config.stop_grace_s):
            return
        if not any(s.job_id == stop.job_id and s.rank == stop.rank for s in self.statuses):
            # Not running here (ended, or started by an earlier agent): confirm it is gone.
            self._queue(
                stop.job_id,
                stop.rank,
                pb.RANK_STATE_EXITED,
                143,
                "not running on this node",
                stop.attempt,
            )

    def _reap(self) -> None:
        for e in self.supervisor.poll():
            self._queue_exit(e, e.reason or ("stopped by the agent" if e.stopped else ""))

    def _queue_exit(self, e: Exit, message: str) -> None:
        self._queue(e.job_id, e.rank, pb.RANK_STATE_EXITED, e.code, message, e.attempt)

    def _queue(
        self,
        job_id: str,
        rank: int,
        state: pb.RankState,
        code: int | None,
        message: str,
        attempt: int = 0,
    ) -> None:
        req = pb.ReportRankStatusRequest(
            node_id=self.node_id or "",
            job_id=job_id,
            rank=rank,
            state=state,
            message=message,
            attempt=attempt,
        )
        if code is not None:
            req.exit_code = code
        self.statuses.append(req)

    def _flush_statuses(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Deliver queued rank states in order; keep the rest if the coordinator is down."""
        while self.statuses and self.node_id is not None:
            req = self.statuses[0]
            req.node_id = self.node_id
            try:
                resp = self.stub.ReportRankStatus(req, timeout=timeout_s)
            except grpc.RpcError as exc:
                if is_unreachable(exc):
                    return
                log.warning(
                    "rank status for job %s rank %d rejected: %s",
                    req.job_id,
                    req.rank,
                    exc.details(),
                )
            else:
                finished = job_terminal(resp.job_state)
                if (
                    finished
                    and req.state == pb.RANK_STATE_RUNNING
                    and self.supervisor.attempt_of(req.job_id, req.rank) == req.attempt
                ):
                    # The job ended while this rank was starting: it must not linger.
                    self.supervisor.stop(req.job_id, req.rank, self.config.stop_grace_s)
                if finished:
                    self.plans.forget(req.job_id)
            self.statuses.pop(0)

    def _deliver_outbox(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Send what waited in the outbox during an outage, oldest first; stop at the
        first sign the coordinator is gone again."""
        box = self.outbox
        if not box.pending or self.node_id is None:
            return
        while (beat := box.telemetry.peek()) is not None:
            beat.node_id = self.node_id or beat.node_id
            if not self._deliver(lambda: self.stub.Heartbeat(beat, timeout=timeout_s)):
                return
            box.telemetry.pop()
        while (report := box.reports.peek()) is not None:
            if not self._deliver(lambda: self.stub.ReportIntervalStats(report, timeout=timeout_s)):
                return
            box.reports.pop()
        log.info("coordinator outage over: %s", box.summary())

    def _deliver(self, call: Callable[[], object]) -> bool:
        """False if the coordinator is unreachable again (keep the item); a refusal
        (the job was restarted or removed) drops the item and is counted."""
        try:
            call()
        except grpc.RpcError as exc:
            if is_unreachable(exc):
                return False
            self.outbox.rejected += 1
            log.warning("buffered item refused by the coordinator: %s", exc.details())
        return True

    def _ship_logs(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
        lines = self.supervisor.take_lines()
        if not lines:
            return
        by_job: dict[str, list[Line]] = defaultdict(list)
        for line in lines:
            by_job[line.job_id].append(line)
        unsent: list[Line] = []
        for job_id, job_lines in by_job.items():
            for start in range(0, len(job_lines), LOG_BATCH):
                chunk = job_lines[start : start + LOG_BATCH]
                req = pb.AppendJobLogsRequest(
                    job_id=job_id,
                    lines=[
                        pb.LogLine(
                            rank=x.rank, stream=x.stream, text=x.text, time_unix_s=x.time_unix_s
                        )
                        for x in chunk
                    ],
                )
                try:
                    self.stub.AppendJobLogs(req, timeout=timeout_s)
                except grpc.RpcError as exc:
                    if is_unreachable(exc):
                        unsent.extend(job_lines[start:])
                        break
                    log.warning("logs of job %s rejected: %s", job_id, exc.details())
                    break
        if unsent:
            self.supervisor.put_back(unsent)
