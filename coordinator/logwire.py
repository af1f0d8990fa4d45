"""Shipped log lines (``hetero.v1``) into the coordinator's rows, within the log caps.

Apart from ``wire`` because log lines are the one message a rank's output fills:
their limits (the column lengths, which PostgreSQL enforces), their checks, the
write of one batch with its charge (``logcaps``) and the note of a gap live here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table, insert, update
from sqlalchemy.orm import Session

from hetero.coordinator.logcaps import NOTE_COST, Admitted, LogCaps, LogLedger, line_cost
from hetero.coordinator.models import JobRow, LogLineRow
from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2 as pb

#: Longest stored log line, in characters (the agent cuts lines there too).
MAX_LOG_LINE_CHARS = 4096
#: The streams a line may come from (the column holds 8 characters).
STREAMS = ("stdout", "stderr")
#: Bytes of lines one ``GetJobLogs`` reply holds at most (it has one line at least):
#: 1,000 lines of 4,096 4-byte characters are 16 MiB, over every message limit.
MAX_REPLY_BYTES = 1024 * 1024

Values = Mapping[str, Any]


def check_lines(req: pb.AppendJobLogsRequest) -> None:
    """INVALID_ARGUMENT for a line from a stream other than :data:`STREAMS` ("" is
    stdout); its rank, time and length are within their ``bounds`` already."""
    for i, line in enumerate(req.lines):
        if line.stream not in ("", *STREAMS):
            raise ConfigError(
                f"AppendJobLogs: lines[{i}]: stream must be stdout or stderr, got {line.stream!r}"
            )


def _text(text: str) -> str:
    """A line as stored: at most :data:`MAX_LOG_LINE_CHARS`, NUL shown as U+FFFD (a rank
    may print binary; PostgreSQL's text refuses NUL, and one such line would fail
    the writer's whole batch)."""
    return text[:MAX_LOG_LINE_CHARS].replace("\x00", "\ufffd")


def _time(t: float, now: float) -> float:
    """The agent's time for a line, never after ``now``: a future time would keep the
    line, and every line behind it, from ageing out (``logpruning`` walks by id)."""
    return min(t, now) if t > 0 else now


class AppendLogs:
    """One batch of a job's lines, written in the writer's transaction: the lines kept,
    the gap's note (added, or rewritten by its seq), and the job's charge.
    ``note_id`` holds the seq of a note added here once it is committed."""

    def __init__(
        self, job_id: str, rows: tuple[Values, ...], cost: int, note: Values | None
    ) -> None:
        self.job_id = job_id
        self.rows = rows
        self.cost = cost
        self.note = note
        self.note_id: int | None = None

    def apply(self, s: Session) -> None:
        lines = cast(Table, LogLineRow.__table__)
        if self.rows:
            s.connection().execute(insert(lines), [dict(r) for r in self.rows])
        if self.note is not None and "id" in self.note:
            rewrite = update(lines).where(lines.c.id == self.note["id"])
            s.connection().execute(rewrite.values(text=self.note["text"]))
        elif self.note is not None:
            added = s.connection().execute(insert(lines).values(dict(self.note)))
            key = added.inserted_primary_key
            assert key is not None
            self.note_id = int(key[0])
        if self.cost:
            jobs = cast(Table, JobRow.__table__)
            charged = update(jobs).where(jobs.c.id == self.job_id)
            s.connection().execute(charged.values(log_bytes=jobs.c.log_bytes + self.cost))


def intake(
    req: pb.AppendJobLogsRequest, owner: str, ledger: LogLedger, caps: LogCaps, now: float
) -> tuple[AppendLogs, Admitted]:
    """The write of a checked batch (``check_lines``) of a job ``owner`` submitted: the
    lines that fit the caps, the gap's note if some did not. Charges ``ledger`` now,
    on the event loop, so the next batch sees this one's charge before it is written."""
    texts = [_text(line.text) for line in req.lines]
    sizes = [len(t.encode("utf-8")) for t in texts]
    admitted = ledger.admit(
        caps, req.job_id, owner, [(line.rank, n) for line, n in zip(req.lines, sizes, strict=True)]
    )
    rows = tuple(
        {
            "job_id": req.job_id,
            "rank": line.rank,
            "stream": line.stream or "stdout",
            "text": text,
            "time_unix_s": _time(line.time_unix_s, now),
            "cost_bytes": line_cost(size),
        }
        for line, text, size in list(zip(req.lines, texts, sizes, strict=True))[: admitted.kept]
    )
    note: Values | None = None
    cost = admitted.kept_cost
    gap = admitted.gap
    if gap is not None and gap.note_id is not None:
        note = {"id": gap.note_id, "text": gap.note()}
    elif gap is not None and admitted.opened:
        cost += NOTE_COST
        note = {
            "job_id": req.job_id,
            "rank": gap.rank,
            "stream": "stderr",
            "text": gap.note(),
            "time_unix_s": now,
            "cost_bytes": NOTE_COST,
        }
    return AppendLogs(req.job_id, rows, cost, note), admitted


def noted(op: AppendLogs, admitted: Admitted) -> AppendLogs | None:
    """After ``op`` committed: the gap it opened learns its note's seq; if batches
    dropped more lines while that note was being written (they could not name it),
    the write that brings its counts up to date."""
    gap = admitted.gap
    if gap is None or op.note_id is None:
        return None
    gap.note_id = op.note_id
    assert op.note is not None
    if gap.note() == op.note["text"]:
        return None
    return AppendLogs(op.job_id, (), 0, {"id": gap.note_id, "text": gap.note()})


def log_page(rows: Sequence[LogLineRow]) -> list[pb.LogLine]:
    """``rows`` as a reply's lines, the first ones up to :data:`MAX_REPLY_BYTES` (one at
    least: the reader asks again after the last it got)."""
    page: list[pb.LogLine] = []
    size = 0
    for row in rows:
        size += len(row.text.encode("utf-8")) + 32
        if page and size > MAX_REPLY_BYTES:
            break
        page.append(log_message(row))
    return page


def log_message(row: LogLineRow) -> pb.LogLine:
    return pb.LogLine(
        seq=row.id, rank=row.rank, stream=row.stream, text=row.text, time_unix_s=row.time_unix_s
    )
