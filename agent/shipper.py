"""The agent's shipper: what it owes the coordinator, delivered in order.

- Rank states (launched, exited) queue in ``statuses`` and are delivered one by
  one; while the coordinator is unreachable they wait (never dropped: a few per
  rank). A state report names its attempt, so the coordinator ignores news of
  old placements.
- What waited in the outbox (``agent.outbox``) during an outage — telemetry and
  interval reports — goes first once the coordinator answers again, so a job's
  statistics arrive before the news that it ended.
- Rank output lines go in batches of at most ``LOG_BATCH`` lines and
  ``LOG_BATCH_BYTES`` bytes (``log_batches``: lines of 4-byte characters made a
  1,000-line batch ~16 MiB, over the coordinator's message limit, and the whole
  batch was lost). Lines that could not be sent go back to the supervisor for the
  next try. A batch the coordinator refuses as too large or as holding a bad line
  is sent again in halves, each alone, down to single lines (``_send``), so one
  line it will not take costs that line only; what it refuses for good is counted
  as dropped with its reason (the supervisor ships a note saying how many and why).
  Lines the coordinator takes but cannot keep within its log caps are its to note
  (``coordinator.logcaps``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence

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

#: Log lines per AppendJobLogs call, at most.
LOG_BATCH = 1000
#: Bytes of log lines per AppendJobLogs call, at most (each line's UTF-8 text and
#: :data:`LINE_FRAMING_BYTES`): far below gRPC's 4 MiB default and the coordinator's
#: ``max_message_bytes`` (8 MiB by default; a lower one refuses the batch, which
#: ``_send`` then splits).
LOG_BATCH_BYTES = 1024 * 1024
#: What one line adds to a request beside its text: rank, stream, time, tags.
LINE_FRAMING_BYTES = 32
#: Statuses of a refused batch that a smaller one may pass: too large a message, or a
#: line the coordinator will not take (sent alone, it alone is dropped).
_SPLIT = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT)


def log_batches(
    lines: Sequence[Line], max_lines: int = LOG_BATCH, max_bytes: int = LOG_BATCH_BYTES
) -> list[list[Line]]:
    """``lines`` in order, cut into batches of at most ``max_lines`` lines and
    ``max_bytes`` bytes (a single longer line is a batch of its own)."""
    batches: list[list[Line]] = []
    size = 0
    for line in lines:
        n = len(line.text.encode("utf-8")) + LINE_FRAMING_BYTES
        if not batches or len(batches[-1]) >= max_lines or size + n > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(line)
        size += n
    return batches


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
        #: Bytes of log lines per AppendJobLogs call, at most.
        self.batch_bytes = LOG_BATCH_BYTES

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
            batches = log_batches(job_lines, max_bytes=self.batch_bytes)
            for i, batch in enumerate(batches):
                left, gone = self._send(job_id, batch, timeout_s)
                rest = [x for later in batches[i + 1 :] for x in later]
                if left:  # unreachable: this batch's rest and every later one wait
                    unsent.extend(left + rest)
                    break
                if gone:  # the job is unknown or not this node's: the rest goes too
                    self.supervisor.count_dropped(rest, gone)
                    break
        if unsent:
            self.supervisor.put_back(unsent)

    def _send(self, job_id: str, batch: Sequence[Line], timeout_s: float) -> tuple[list[Line], str]:
        """Send ``batch``; a batch refused as too large or as holding a bad line is sent
        again in halves, each alone, down to single lines. Returns the lines left
        unsent because the coordinator stopped answering (put back by the caller), and,
        when it refused the job's lines for good (the job unknown, not this node's),
        the reason; lines refused on their own are counted as dropped here."""
        req = pb.AppendJobLogsRequest(
            job_id=job_id,
            lines=[
                pb.LogLine(rank=x.rank, stream=x.stream, text=x.text, time_unix_s=x.time_unix_s)
                for x in batch
            ],
        )
        try:
            self.link.stub.AppendJobLogs(req, timeout=timeout_s)
            return [], ""
        except grpc.RpcError as exc:
            if is_unreachable(exc):
                return list(batch), ""
            code, details = exc.code(), " ".join(str(exc.details()).split())[:300]
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" not in details:
            return list(batch), ""  # too many calls at once: try again, as when unreachable
        if code in _SPLIT and len(batch) > 1:
            half = len(batch) // 2
            left, gone = self._send(job_id, batch[:half], timeout_s)
            if left:
                return left + list(batch[half:]), ""
            if gone:
                self.supervisor.count_dropped(batch[half:], gone)
                return [], gone
            return self._send(job_id, batch[half:], timeout_s)
        reason = f"refused by the coordinator: {details}"
        log.warning("%d log lines of job %s dropped, %s", len(batch), job_id, reason)
        self.supervisor.count_dropped(batch, reason)
        return [], "" if code in _SPLIT else reason
