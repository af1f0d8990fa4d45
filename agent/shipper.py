"""The agent's shipper: what it owes the coordinator, delivered in order.

- Rank states (launched, exited) queue in ``statuses`` and are delivered one by
  one; while the coordinator is unreachable they wait (never dropped: a few per
  rank). A state report names its attempt, so the coordinator ignores news of
  old placements.
- What waited in the outbox (``agent.outbox``) during an outage — telemetry and
  interval reports — goes first once the coordinator answers again, so a job's
  statistics arrive before the news that it ended.
- Rank output lines go in batches of ``LOG_BATCH``; lines that could not be sent
  go back to the supervisor for the next try, and lines the coordinator refused
  are counted as dropped (the supervisor ships a note saying how many).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

import grpc

from hetero.agent.config import AgentConfig
from hetero.agent.link import CALL_TIMEOUT_S, CoordinatorLink
from hetero.agent.local import PlanCache
from hetero.agent.outbox import Outbox
from hetero.agent.supervisor import Exit, Line, Supervisor
from hetero.core.states import job_terminal
from hetero.security.transport import is_unreachable
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.agent")

#: Log lines per AppendJobLogs call.
LOG_BATCH = 1000


class Shipper:
    """Delivers rank states, the outbox and rank output through ``link``."""

    def __init__(
        self,
        config: AgentConfig,
        link: CoordinatorLink,
        supervisor: Supervisor,
        plans: PlanCache,
        outbox: Outbox,
    ) -> None:
        self.config = config
        self.link = link
        self.supervisor = supervisor
        self.plans = plans
        self.outbox = outbox
        self.statuses: list[pb.ReportRankStatusRequest] = []

    def queue_exit(self, e: Exit, message: str) -> None:
        self.queue(e.job_id, e.rank, pb.RANK_STATE_EXITED, e.code, message, e.attempt)

    def queue(
        self,
        job_id: str,
        rank: int,
        state: pb.RankState,
        code: int | None,
        message: str,
        attempt: int = 0,
    ) -> None:
        req = pb.ReportRankStatusRequest(
            node_id=self.link.node_id or "",
            job_id=job_id,
            rank=rank,
            state=state,
            message=message,
            attempt=attempt,
        )
        if code is not None:
            req.exit_code = code
        self.statuses.append(req)

    def flush_statuses(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Deliver queued rank states in order; keep the rest if the coordinator is down."""
        while self.statuses and self.link.node_id is not None:
            req = self.statuses[0]
            req.node_id = self.link.node_id
            try:
                resp = self.link.stub.ReportRankStatus(req, timeout=timeout_s)
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

    def deliver_outbox(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Send what waited in the outbox during an outage, oldest first; stop at the
        first sign the coordinator is gone again."""
        box = self.outbox
        if not box.pending or self.link.node_id is None:
            return
        while (beat := box.telemetry.peek()) is not None:
            beat.node_id = self.link.node_id or beat.node_id
            if not self._deliver(lambda: self.link.stub.Heartbeat(beat, timeout=timeout_s)):
                return
            box.telemetry.pop()
        while (report := box.reports.peek()) is not None:
            if not self._deliver(
                lambda: self.link.stub.ReportIntervalStats(report, timeout=timeout_s)
            ):
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

    def ship_logs(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
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
                    self.link.stub.AppendJobLogs(req, timeout=timeout_s)
                except grpc.RpcError as exc:
                    if is_unreachable(exc):
                        unsent.extend(job_lines[start:])
                        break
                    refused = job_lines[start:]
                    log.warning(
                        "%d log lines of job %s dropped, refused by the coordinator: %s",
                        len(refused),
                        job_id,
                        exc.details(),
                    )
                    self.supervisor.count_dropped(refused)
                    break
        if unsent:
            self.supervisor.put_back(unsent)
