"""Rank output is bounded on the node and a dropped line is never silent (issue 17 item 6).

A real rank process floods its output; the agent's supervisor must keep its log
files within the cap, rotate them, and say how many lines it could not ship."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from hetero.agent.ranklog import RankLogLimits
from hetero.agent.supervisor import DROPPED_PREFIX, Supervisor
from hetero.core.errors import ConfigError

LINES = 20_000
FLOOD = f"import sys\nfor i in range({LINES}): sys.stdout.write(f'line {{i:06d}} ' + 'x' * 50 + '\\n')\n"


def _run_to_end(sup: Supervisor, job: str, rank: int = 0, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while sup.running(job, rank):
        assert time.monotonic() < deadline, "the rank did not end"
        sup.poll()
        time.sleep(0.05)


def test_a_flooding_rank_keeps_its_log_files_within_the_cap_and_counts_what_it_dropped(
    tmp_path: Path,
) -> None:
    limits = RankLogLimits(max_bytes=64 * 1024, keep=2)
    sup = Supervisor(tmp_path, log_limits=limits, max_pending_lines=1_000)
    sup.launch("job-flood", 0, [sys.executable, "-c", FLOOD], {}, tmp_path / "work")
    _run_to_end(sup, "job-flood")

    job_dir = sup.job_dir("job-flood")
    files = sorted(p.name for p in job_dir.iterdir())
    assert files == ["rank0.log", "rank0.log.1", "rank0.log.2"], files
    line_bytes = len("line 000000 ") + 50 + 1
    for name in files:
        assert (job_dir / name).stat().st_size <= limits.max_bytes + line_bytes, name
    # The newest lines are on disk, in order, the last one whole.
    tail = (job_dir / "rank0.log").read_text().splitlines()
    assert tail[-1].startswith(f"line {LINES - 1:06d} ")

    lines = sup.take_lines()
    notes = [x for x in lines if x.text.startswith(DROPPED_PREFIX)]
    kept = [x for x in lines if not x.text.startswith(DROPPED_PREFIX)]
    assert len(kept) == 1_000 and kept[-1].text.startswith(f"line {LINES - 1:06d} ")
    assert len(notes) == 1 and notes[0].rank == 0
    assert notes[0].text.startswith(f"{DROPPED_PREFIX}{LINES - 1_000} lines dropped")
    assert sup.dropped_total == LINES - 1_000
    assert sup.take_lines() == []  # counted once: the note is not repeated


def test_lines_the_coordinator_refused_or_that_no_longer_fit_are_counted(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, max_pending_lines=10)
    sup.launch(
        "job-a",
        3,
        [sys.executable, "-c", "print('\\n'.join(map(str, range(8))))"],
        {},
        tmp_path / "work",
    )
    _run_to_end(sup, "job-a", 3)
    first = sup.take_lines()
    assert [x.text for x in first] == [str(i) for i in range(8)]
    sup.count_dropped(first[:3], "refused by the coordinator: no")  # the note says why
    sup.put_back(first[3:])  # unreachable: back into the queue
    again = sup.take_lines()
    assert again[0].text == (
        f"{DROPPED_PREFIX}3 lines dropped before shipping (refused by the coordinator: no); "
        "rank3.log* on the node have them"
    )
    assert again[0].rank == 3
    assert [x.text for x in again[1:]] == [str(i) for i in range(3, 8)]
    sup.put_back(again)  # the note is put back like any line, never counted as a drop
    assert sup.take_lines()[0].text == again[0].text and sup.dropped_total == 3


@pytest.mark.parametrize(("max_bytes", "keep"), [(100, 3), (1 << 20, 0)])
def test_rank_log_limits_out_of_range_are_config_errors(max_bytes: int, keep: int) -> None:
    with pytest.raises(ConfigError, match="rank_log_"):
        RankLogLimits(max_bytes, keep)
