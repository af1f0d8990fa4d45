"""The GPU + CPU question: the balancer's exclusion forecast from a run's own metrics."""

from __future__ import annotations

import pytest

from hetero.bench.harness.forecast import (
    exclusion_forecasts,
    history_from_metrics,
    predicted_rate,
)
from hetero.core.balancer import estimate_comm_s


def _ranks(per_sample_s: list[float], batches: list[int], wall_s: float) -> list[list[dict]]:
    out = []
    for rank, (a, b) in enumerate(zip(per_sample_s, batches, strict=True)):
        recs = []
        for k in range(1, 9):
            bb = b + (k % 3) if rank else b - 2 * (k % 3)  # some spread for the fit
            recs.append(
                {
                    "step": 2 * k,
                    "batch": bb,
                    "steps_measured": 2,
                    "compute_s": 0.005 + a * bb,
                    "step_s": wall_s,
                }
            )
        out.append(recs)
    return out


def test_history_skips_intervals_without_compute_times() -> None:
    ranks = _ranks([1e-4, 1e-2], [500, 12], 0.3)
    ranks[1][0]["compute_s"] = None
    assert len(history_from_metrics(ranks)) == 7


def test_each_cpu_rank_gets_the_balancers_forecast_with_the_exposed_comm_time() -> None:
    # A GPU at 0.1 ms/sample beside two CPUs at 20 ms/sample, 0.3 s wall per step (mostly
    # the Gloo all-reduce). Without one CPU rank the ring all-reduce of 2 ranks moves
    # (1/2)/(2/3) = 0.75 of the bytes of 3 ranks': the forecast gains by it.
    ranks = _ranks([1e-4, 2e-2, 2e-2], [500, 6, 6], 0.3)
    out = exclusion_forecasts(ranks, 512, [1, 2])
    assert [f["ranks"] for f in out] == [[1], [2], [1, 2]]
    for f in out[:2]:
        assert f["comm_s"] > 0.1
        assert f["comm_s_without"] == pytest.approx(0.75 * f["comm_s"])
        assert f["gain"] > 0.05 and f["worthwhile"]
        assert f["gain"] == f["samples_per_s_without"] / f["samples_per_s"] - 1.0
        assert f["message"].startswith(f"excluding rank {f['rank']} would raise")
    # Without both CPU ranks: one rank, no all-reduce, the GPU's own rate.
    assert out[2]["comm_s_without"] == 0.0
    assert out[2]["samples_per_s_without"] == pytest.approx(512 / (0.005 + 1e-4 * 512), rel=0.02)
    assert out[2]["message"].startswith("excluding ranks 1, 2 would raise")


def test_without_its_only_cpu_rank_the_forecast_is_the_gpu_alone() -> None:
    # gpu-cpu-hybrid: one GPU and one CPU rank. The job without the CPU rank has one rank
    # and no all-reduce: the forecast is the GPU's own rate, as a gpu-only run measures.
    ranks = _ranks([1e-4, 2e-2], [500, 12], 0.3)
    (f,) = exclusion_forecasts(ranks, 512, [1])
    assert f["comm_s_without"] == 0.0 and "no all-reduce" in f["message"]
    gpu_alone = 512 / (0.005 + 1e-4 * 512)  # the fitted GPU model at the whole batch
    assert f["samples_per_s_without"] == pytest.approx(gpu_alone, rel=0.02)
    assert f["worthwhile"]
    assert f["coordinator_excludes"], "a straggler whose forecast agreed over 3 intervals"


def test_too_little_history_gives_no_forecast() -> None:
    one_interval = [recs[:1] for recs in _ranks([1e-4, 1e-2], [500, 12], 0.3)]
    assert exclusion_forecasts(one_interval, 512, [1]) == []


def test_predicted_rate_is_the_fitted_step_of_the_plan_from_intervals_up_to_the_cut() -> None:
    # Rank 0 at 1 ms/sample, rank 1 at 2 ms/sample (both + 5 ms fixed), 10 ms exposed
    # communication per step. Records after the cut (step > 16) are ignored.
    ranks = _ranks([1e-3, 2e-3], [60, 30], 0.0)
    for rank in ranks:
        for r in rank:
            r["step_s"] = max(0.005 + 1e-3 * 60, 0.005 + 2e-3 * 33) + 0.010
    ranks[0].append({"step": 18, "batch": 60, "steps_measured": 2, "compute_s": 9.0, "step_s": 9.0})
    ranks[1].append({"step": 18, "batch": 30, "steps_measured": 2, "compute_s": 9.0, "step_s": 9.0})
    predicted = predicted_rate(ranks, 90, [60, 30], upto_step=16)
    assert predicted is not None
    # step = max(5 + 60, 5 + 60) ms + the median exposed comm time of the intervals
    expected_step = 0.065 + estimate_comm_s(history_from_metrics(ranks)[:8])
    assert abs(predicted - 90 / expected_step) / predicted < 0.02
    assert predicted_rate([[{"step": 10, "compute_s": None}]], 90, [90], upto_step=10) is None
