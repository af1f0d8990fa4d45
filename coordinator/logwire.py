"""Conversions between shipped log lines (``hetero.v1``) and the coordinator's rows.

Apart from ``wire`` because log lines are the one message a rank's output fills:
their limits (the column lengths, which PostgreSQL enforces) live here.
"""

from __future__ import annotations

import math

from hetero.coordinator.models import LogLineRow
from hetero.v1 import coordinator_pb2 as pb

#: Longest stored log line, in characters (the agent cuts lines there too).
MAX_LOG_LINE_CHARS = 4096
#: Longest stored stream name (the column's length, which PostgreSQL enforces).
MAX_STREAM_CHARS = 8


def log_rows(req: pb.AppendJobLogsRequest, now: float) -> list[LogLineRow]:
    """Rows for shipped lines; a time that is missing or not a finite number becomes ``now``."""
    return [
        LogLineRow(
            rank=line.rank,
            stream=line.stream[:MAX_STREAM_CHARS] or "stdout",
            text=line.text[:MAX_LOG_LINE_CHARS],
            time_unix_s=line.time_unix_s if _positive(line.time_unix_s) else now,
        )
        for line in req.lines
    ]


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def log_message(row: LogLineRow) -> pb.LogLine:
    return pb.LogLine(
        seq=row.id, rank=row.rank, stream=row.stream, text=row.text, time_unix_s=row.time_unix_s
    )
