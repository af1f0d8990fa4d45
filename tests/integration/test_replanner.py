"""The balancer's worker process (``coordinator.replanner``): the same decisions as a fit
in the coordinator's own process, a worker that dies is replaced without a report
failing, and a plan chosen while the job changed is not stored."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hetero.bench.loadgen import device_profiles
from hetero.coordinator.asyncserver import _ThreadContext
from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.replanner import Replanner
from hetero.coordinator.service import CoordinatorService, Deps
from hetero.core.balancer import Constraints, Horizon, RankInterval
from hetero.core.replan import Replan, replan
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

FAST, SLOW = RankInterval(0, 32, 10, 0.1), RankInterval(1, 32, 10, 0.3)
SPEC = """\
name: cancelled-during-fit
model: debug
global_batch: 32
steps: 100000
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 2
  device: cuda
"""
ARGS = ("dynamic", [[FAST, SLOW]] * 12, (32, 32), Constraints(64, 2), [], 50, Horizon(10, 1000))


@pytest.fixture
def replanner() -> Iterator[Replanner]:
    r = Replanner()
    try:
        yield r
    finally:
        r.close()


def _worker_pids(r: Replanner) -> list[int]:
    assert r.wait_ready(60.0) and r._pool is not None, "the worker did not start"
    return [p.pid for p in r._pool._processes.values()]  # type: ignore[attr-defined]


def test_the_worker_decides_as_the_coordinator_would(replanner: Replanner) -> None:
    assert replanner._pool is None  # started by the first report, not before
    here = replan(*ARGS)
    assert replanner.replan(*ARGS) == here  # fitted here while the worker starts
    assert replanner.wait_ready(60.0)
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
    # The next report starts a new worker (and is fitted here while it starts).
    assert replanner.replan(*ARGS) == result
    assert replanner.fallbacks == 1
    assert _worker_pids(replanner) and pid not in _worker_pids(replanner)


class _CancelDuringFit:
    """The real fit, with the job cancelled through the real service while it runs: what
    a user's cancel between the report's two transactions looks like."""

    def __init__(self, service: CoordinatorService, job_id: str) -> None:
        self.service, self.job_id, self.cancelled = service, job_id, False
        #: Plans the job had stored when it was cancelled.
        self.plans_at_cancel = 0

    def replan(self, *args: Any) -> Replan:
        result = replan(*args)
        if result.decision.changed and not self.cancelled:
            ctx = _ThreadContext()
            self.service.CancelJob(pb.CancelJobRequest(job_id=self.job_id), ctx)
            detail = self.service.GetJobDetail(pb.GetJobDetailRequest(job_id=self.job_id), ctx)
            self.plans_at_cancel = len(detail.plans)
            self.cancelled = True
        return result


def test_a_plan_chosen_while_the_job_was_cancelled_is_not_stored(tmp_path: Path) -> None:
    engine = open_database(f"sqlite:///{tmp_path / 'c.db'}")
    deps = Deps(sessions=session_factory(engine))
    service, ctx = CoordinatorService(deps), _ThreadContext()
    try:
        node = service.RegisterNode(
            pb.RegisterNodeRequest(name="n", address="10.0.0.1", devices=device_profiles(2)), ctx
        ).node_id
        job = service.SubmitJob(pb.SubmitJobRequest(spec_yaml=SPEC), ctx)
        for r in job.job.ranks:
            service.ReportRankStatus(
                pb.ReportRankStatusRequest(
                    node_id=node, job_id=job.job_id, rank=r.rank, state=pb.RANK_STATE_RUNNING
                ),
                ctx,
            )
        hook = _CancelDuringFit(service, job.job_id)
        object.__setattr__(deps, "replanner", hook)
        version, step = 1, 0
        while not hook.cancelled and step < 500:
            step += 10
            report = tpb.IntervalReport(job_id=job.job_id, end_step=step, plan_version=version)
            for rank, per_sample_s in ((0, 0.001), (1, 0.003)):
                report.ranks.add(
                    rank=rank, batch=16, steps=10, compute_s=16 * per_sample_s, step_s=0.06
                )
            version = service.ReportIntervalStats(report, ctx).plan.version
        assert hook.cancelled, "the balancer never changed the plan"
        # The reply is the newest stored plan, and the plan chosen during the cancel was
        # not stored after it.
        detail = service.GetJobDetail(pb.GetJobDetailRequest(job_id=job.job_id), ctx)
        assert detail.job.state == pb.JOB_STATE_CANCELLED
        assert len(detail.plans) == hook.plans_at_cancel
        assert version == max(p.version for p in detail.plans)
    finally:
        engine.dispose()
