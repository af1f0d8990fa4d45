"""The balancer's worker process (``coordinator.replanner``): the same decisions as a fit
in the coordinator's own process, and a worker that dies is replaced without a report
failing."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from hetero.coordinator.replanner import Replanner
from hetero.core.balancer import Constraints, Horizon, RankInterval
from hetero.core.replan import replan

FAST, SLOW = RankInterval(0, 32, 10, 0.1), RankInterval(1, 32, 10, 0.3)
ARGS = ("dynamic", [[FAST, SLOW]] * 12, (32, 32), Constraints(64, 2), [], 50, Horizon(10, 1000))


@pytest.fixture
def replanner() -> Iterator[Replanner]:
    r = Replanner()
    try:
        yield r
    finally:
        r.close()


def _worker_pids(r: Replanner) -> list[int]:
    return [p.pid for p in r._pool._processes.values()]  # type: ignore[attr-defined]


def test_the_worker_decides_as_the_coordinator_would(replanner: Replanner) -> None:
    here = replan(*ARGS)
    there = replanner.replan(*ARGS)
    assert there == here
    assert there.decision.changed and there.decision.batches[0] > there.decision.batches[1]
    assert replanner.fallbacks == 0
    assert _worker_pids(replanner) and os.getpid() not in _worker_pids(replanner)


def test_a_killed_worker_is_replaced_and_the_report_is_fitted_here(replanner: Replanner) -> None:
    replanner.replan(*ARGS)
    (pid,) = _worker_pids(replanner)
    os.kill(pid, signal.SIGKILL)
    result = replanner.replan(*ARGS)
    assert result == replan(*ARGS)
    assert replanner.fallbacks == 1
    # The next report goes to a new worker.
    assert replanner.replan(*ARGS) == result
    assert replanner.fallbacks == 1
    assert _worker_pids(replanner) and pid not in _worker_pids(replanner)
