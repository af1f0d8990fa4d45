"""The coordinator's job counters (``metrics.CoordinatorMetrics``): samples and steps
counted from accepted interval reports, exported as prometheus-client counters, and
removed once the job has ended, as a scrape of the cluster sees it."""

from __future__ import annotations

from prometheus_client import generate_latest

from hetero.coordinator.metrics import CoordinatorMetrics
from hetero.coordinator.snapshots import Snapshots
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


def _report(job: str, steps: int, batches: list[int]) -> tpb.IntervalReport:
    ranks = [tpb.RankIntervalStats(rank=r, batch=b, steps=steps) for r, b in enumerate(batches)]
    return tpb.IntervalReport(job_id=job, end_step=steps, ranks=ranks)


def test_a_jobs_samples_and_steps_are_counters_that_go_when_the_job_ends() -> None:
    metrics = CoordinatorMetrics()
    state = [pb.JOB_STATE_RUNNING]
    metrics.attach(
        Snapshots.of(lambda: pb.ClusterSnapshot(jobs=[pb.Job(id="j1", state=state[0])]), 0.0)
    )
    metrics.interval(_report("j1", 10, [24, 8]))
    metrics.interval(_report("j1", 10, [20, 12]))
    text = generate_latest(metrics.registry).decode()
    assert 'hetero_job_samples_total{job="j1"} 640.0' in text
    assert 'hetero_job_steps_total{job="j1"} 20.0' in text
    state[0] = pb.JOB_STATE_SUCCEEDED
    generate_latest(metrics.registry)  # the scrape that sees it ended removes its series
    text = generate_latest(metrics.registry).decode()
    assert "hetero_job_samples_total{" not in text and "hetero_job_steps_total{" not in text
