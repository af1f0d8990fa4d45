"""hetero-top's core without the UI: import purity, formatting, alert rules, detail model,
and the coordinator's throughput estimates they display."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hetero.coordinator.throughput import RankPhases, estimate
from hetero.core.errors import ConfigError
from hetero.tui import format as fmt
from hetero.tui.alerts import AlertRules, job_alerts
from hetero.tui.detail import detail_view
from hetero.tui.state import (
    ClusterState,
    DeviceView,
    JobView,
    LiveView,
    NodeView,
    RankStats,
    RankView,
)
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


def test_core_imports_without_textual() -> None:
    code = (
        "import sys\n"
        "import hetero.tui.state, hetero.tui.format, hetero.tui.alerts, hetero.tui.detail\n"
        "import hetero.tui.panels, hetero.tui.client\n"
        "assert 'textual' not in sys.modules, sorted(m for m in sys.modules if 'textual' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sparkline_scales_pads_and_stretches() -> None:
    assert fmt.sparkline([0, 50, 100], 5, 0, 100) == "  ▁▅█"
    assert fmt.sparkline([7, 7], 2) == "▁▁", "a flat series sits at the bottom"
    assert fmt.sparkline(fmt.stretch([0, 100], 6), 6, 0, 100) == "▁▁▁███"
    assert fmt.sparkline([], 3) == "   "


def test_stacked_bar_fills_its_share_of_the_width_exactly() -> None:
    bar = fmt.stacked_bar([(1.0, "red"), (2.0, "green"), (0.01, "blue")], total=4.0, width=40)
    assert len(bar.plain) == 30, "3.01 of 4 s is 30 of 40 cells"
    assert bar.plain.count("█") == 30 and [s.style for s in bar.spans] == ["red", "green"]


def test_units_print_na_when_unknown() -> None:
    assert (fmt.age(None), fmt.rate(None), fmt.celsius(None)) == ("n/a", "n/a", "n/a")
    assert (fmt.age(75), fmt.age(7200), fmt.rate(1293.1), fmt.rate(673.6)) == (
        "1m",
        "2h",
        "1.29k",
        "674",
    )


def test_throughput_equal_estimate_and_ideal_bracket_a_balanced_run() -> None:
    # Rank 1 is 3x slower per sample; the plan gave it a third of rank 0's batch.
    ranks = [
        RankPhases(0, batch=72, steps=10, compute_s=0.072, step_s=0.080, comm_wait_s=0.006),
        RankPhases(1, batch=24, steps=10, compute_s=0.072, step_s=0.080, comm_wait_s=0.006),
    ]
    t = estimate(ranks, global_batch=96)
    assert t.samples_per_s == pytest.approx(96 / 0.080)
    # Equal: 48 samples at 3 ms on the slow rank, plus 8 ms of overhead.
    assert t.equal_samples_per_s == pytest.approx(96 / (0.003 * 48 + 0.008))
    assert t.ideal_samples_per_s == pytest.approx(72 / 0.074 + 24 / 0.074)
    assert t.equal_samples_per_s < t.samples_per_s < t.ideal_samples_per_s
    assert estimate([RankPhases(0, 0, 0, 0.0, 0.0)], 96).samples_per_s is None


def _stats(rank: int, **kw: float) -> RankStats:
    base = dict(
        batch=32,
        steps=10,
        compute_s=0.05,
        step_s=0.1,
        data_s=0.01,
        forward_s=None,
        backward_s=None,
        comm_wait_s=0.01,
        optimizer_s=0.01,
        peak_memory_bytes=1 << 30,
    )
    base.update(kw)
    return RankStats(rank=rank, **base)  # type: ignore[arg-type]


def _cluster_and_job(*ranks: RankStats) -> tuple[ClusterState, JobView]:
    devices = tuple(
        DeviceView(
            "n1",
            "node1",
            r.rank,
            "gpu",
            "cuda",
            1.0,
            1.0,
            10 << 30,
            None,
            None,
            None,
            None,
            None,
            None,
        )
        for r in ranks
    )
    cluster = ClusterState(
        0.0, (NodeView("n1", "node1", "a", "up", False, 0.0, None, devices),), ()
    )
    live = LiveView(10, 1, 100.0, 50.0, 120.0, None, False, tuple(ranks), ())
    job = JobView(
        "j1",
        "job",
        "running",
        "dynamic",
        64,
        len(ranks),
        "nccl",
        10,
        100,
        0,
        "",
        1,
        tuple(RankView(r.rank, "n1", "node1", r.rank, "gpu", "running", 1.0, 32) for r in ranks),
        live,
    )
    return cluster, job


def test_alert_rules_name_the_bottleneck() -> None:
    cluster, job = _cluster_and_job(_stats(0), _stats(1))
    assert job_alerts(job, cluster) == (), "a healthy interval raises nothing"
    cluster, job = _cluster_and_job(_stats(0, data_s=0.04), _stats(1))
    assert [(a.kind, a.rank) for a in job_alerts(job, cluster)] == [("input-bound", 0)]
    # The fast rank waits 60% (imbalance); the slow one 35%: the network's share is 35%.
    cluster, job = _cluster_and_job(_stats(0, comm_wait_s=0.06), _stats(1, comm_wait_s=0.035))
    (alert,) = job_alerts(job, cluster)
    assert alert.kind == "communication-bound" and "35%" in alert.message
    cluster, job = _cluster_and_job(_stats(0, comm_wait_s=0.06), _stats(1, comm_wait_s=0.01))
    assert job_alerts(job, cluster) == (), "imbalance alone is not communication-bound"
    cluster, job = _cluster_and_job(_stats(0), _stats(1, peak_memory_bytes=int(9.5 * (1 << 30))))
    assert [(a.kind, a.rank) for a in job_alerts(job, cluster)] == [("memory-bound", 1)]
    with pytest.raises(ConfigError, match="input_bound_fraction"):
        AlertRules(input_bound_fraction=0.0)


def test_detail_view_aligns_series_by_interval_and_splits_the_step() -> None:
    msg = pb.JobDetail(job=pb.Job(id="j", name="j", world_size=2, plan=tpb.Plan(batches=[3, 1])))
    for step, batches in ((10, (2, 2)), (20, (3, 1))):
        iv = msg.intervals.add(job_id="j", end_step=step)
        for rank, b in enumerate(batches):
            iv.ranks.add(
                rank=rank,
                batch=b,
                steps=10,
                compute_s=0.01 * b,
                step_s=0.05,
                forward_s=0.004 * b,
                backward_s=0.006 * b,
                loss_sum=2.0 * b * 10,
                samples=b * 10,
            )
    view = detail_view(msg)
    assert view.steps == (10, 20) and view.batches == ((2, 3), (2, 1))
    assert view.per_sample_s[1] == pytest.approx((0.01, 0.01))
    assert view.loss == ((10, 2.0), (20, 2.0))
    p0 = view.breakdown[0]
    assert p0.split and p0.forward_s == pytest.approx(0.012)
    assert p0.other_s == pytest.approx(0.05 - 0.03), "time no phase covers is kept, not lost"
