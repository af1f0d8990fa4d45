"""The agent's outage buffers: bounded, oldest dropped first and counted, FIFO delivery."""

from __future__ import annotations

from hetero.agent.outbox import TELEMETRY_PERIOD_S, Bounded, Outbox
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


def test_a_full_buffer_drops_its_oldest_and_counts_it() -> None:
    box: Bounded[int] = Bounded(3)
    for i in range(5):
        box.put(i)
    assert len(box) == 3 and box.dropped == 2
    got = []
    while (item := box.peek()) is not None:
        got.append(item)
        box.pop()
    assert got == [2, 3, 4] and box.delivered == 3


def test_reports_are_copied_and_telemetry_kept_once_per_period() -> None:
    out = Outbox(max_reports=10, max_telemetry=10)
    report = tpb.IntervalReport(job_id="j", end_step=5)
    out.keep_report(report)
    report.end_step = 99  # the caller's message may be reused
    assert out.reports.peek() is not None and out.reports.peek().end_step == 5  # type: ignore[union-attr]
    for k in range(25):  # 25 samples 1 s apart: one per 10-s period kept
        out.keep_telemetry(pb.HeartbeatRequest(node_id="n"), 1000.0 + k)
    assert len(out.telemetry) == 3
    first = out.telemetry.peek()
    assert first is not None and first.sampled_at_unix_s == 1000.0
    assert TELEMETRY_PERIOD_S == 10.0
    assert out.pending == 4
