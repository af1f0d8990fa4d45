"""Straggler detection over the history, and the exclusion forecast."""

from __future__ import annotations

import random

import pytest

from hetero.core.balancer import (
    Constraints,
    RankInterval,
    StepModel,
    StragglerDetector,
    detect_stragglers,
    predict_exclusion,
)
from hetero.core.balancer.straggler import new_stragglers
from hetero.core.errors import ConfigError, PlanError


def per_sample_interval(seconds_per_sample: list[float], batch: int = 100):
    return tuple(RankInterval(r, batch, 20, s * batch) for r, s in enumerate(seconds_per_sample))


def test_a_rank_slower_than_threshold_for_consecutive_intervals_is_flagged_with_evidence() -> None:
    history = [per_sample_interval([1e-3] * 4)] * 3 + [per_sample_interval([1e-3] * 3 + [1.5e-3])]
    assert detect_stragglers(history) == ()  # one interval is not enough
    history.append(per_sample_interval([1e-3] * 3 + [1.5e-3]))
    (evidence,) = detect_stragglers(history)
    assert evidence.rank == 3
    assert evidence.ratio == pytest.approx(1.5)
    assert evidence.intervals == 2
    assert "rank 3" in evidence.message and "1.50x" in evidence.message


def test_with_two_ranks_the_slower_is_compared_with_the_other_not_with_their_mean() -> None:
    history = [per_sample_interval([1e-3, 1.5e-3])] * 2
    assert [e.rank for e in detect_stragglers(history)] == [1]


def test_a_run_broken_by_one_normal_interval_starts_over() -> None:
    slow = per_sample_interval([1e-3, 1e-3, 2e-3])
    normal = per_sample_interval([1e-3] * 3)
    assert detect_stragglers([slow, normal, slow]) == ()


def test_no_false_positive_in_a_thousand_intervals_of_five_percent_noise() -> None:
    rng = random.Random(11)
    detector = StragglerDetector()
    history = []
    flagged = 0
    for _ in range(1000):
        # 20 steps of 5% noise per interval: the interval mean carries about 1.1%.
        means = [sum(rng.gauss(1.0, 0.05) for _ in range(20)) / 20 for _ in range(8)]
        history.append(per_sample_interval([1e-3 * m for m in means]))
        flagged += len(detector.detect(history))
    assert flagged == 0


def test_detector_configuration_is_validated() -> None:
    with pytest.raises(ConfigError):
        StragglerDetector(threshold=1.0)
    with pytest.raises(ConfigError):
        StragglerDetector(consecutive=0)


def test_excluding_a_much_slower_rank_is_predicted_to_pay_when_fixed_costs_dominate_it() -> None:
    # The slow rank's fixed cost alone (50 ms) exceeds the others' whole step (~31 ms).
    models = [StepModel(0.0001, 0.005)] * 3 + [StepModel(0.004, 0.05)]
    forecast = predict_exclusion(models, Constraints(768, 4), 3)
    assert forecast.worthwhile
    assert forecast.gain > 0.05
    assert sum(forecast.plan_without) == 768 and len(forecast.plan_without) == 3
    assert "would raise" in forecast.message


def test_excluding_a_fast_rank_is_predicted_to_cost_throughput() -> None:
    models = [StepModel(0.0002, 0.005)] * 3 + [StepModel(0.0004, 0.005)]
    forecast = predict_exclusion(models, Constraints(768, 4), 0)
    assert not forecast.worthwhile
    assert forecast.gain < 0
    assert forecast.samples_per_s_without < forecast.samples_per_s


def test_exclusion_is_refused_when_the_other_ranks_memory_cannot_hold_the_batch() -> None:
    models = [StepModel(0.0002, 0.005)] * 2
    forecast = predict_exclusion(models, Constraints(256, 2, max_batch=(150, 150)), 1)
    assert not forecast.worthwhile and forecast.plan_without == ()
    assert "cannot be excluded" in forecast.message
    with pytest.raises(PlanError):
        predict_exclusion(models, Constraints(256, 2), 5)


def test_times_that_underflow_or_batches_of_zero_are_no_evidence_not_a_crash() -> None:
    from hetero.core.balancer.changepoint import consistent
    from hetero.core.balancer.straggler import per_sample_ratios

    tiny = [
        RankInterval(0, 8, 10, 5e-324),
        RankInterval(1, 8, 10, 0.1),
        RankInterval(2, 8, 10, 0.1),
    ]
    ratios = per_sample_ratios(tiny)
    assert ratios[0] is None and ratios[1] == pytest.approx(1.0)
    assert not consistent((8, 0.1), (0, 0.1), 0.15)
    assert not consistent((8, 5e-324), (1, 5e-324), 0.15)  # t0 * b / b0 underflows to 0


def test_a_job_of_one_rank_is_charged_no_all_reduce() -> None:
    # A GPU and a CPU rank with 0.3 s of exposed Gloo all-reduce per step: the GPU alone
    # runs without any, at its own rate.
    gpu, cpu = StepModel(1e-4, 0.005), StepModel(2e-2, 0.01)
    forecast = predict_exclusion([gpu, cpu], Constraints(512, 2, comm_s=0.3), 1)
    assert forecast.samples_per_s_without == pytest.approx(512 / gpu.time(512))
    assert forecast.worthwhile and "no all-reduce with one rank" in forecast.message


def test_the_all_reduce_of_a_smaller_ring_is_scaled_and_a_backend_change_is_named() -> None:
    from hetero.core.balancer import all_reduce_s

    assert all_reduce_s(0.3, 3, 2) == pytest.approx(0.3 * 0.75)
    assert all_reduce_s(0.3, 4, 3) == pytest.approx(0.3 * (2 / 3) / (3 / 4))
    assert all_reduce_s(0.3, 2, 1) == 0.0
    models = [StepModel(1e-4, 0.005)] * 2 + [StepModel(2e-2, 0.01)]
    forecast = predict_exclusion(
        models, Constraints(512, 3, comm_s=0.2), 2, kinds=["cuda", "cuda", "cpu"]
    )
    assert "all-reduce 200.0 -> 150.0 ms, an upper bound: the job would run on nccl" in (
        forecast.message
    )


def test_new_stragglers_are_the_ranks_flagged_now_and_not_one_interval_before() -> None:
    rng = random.Random(5)
    history: list[tuple[RankInterval, ...]] = []
    new = 0
    for _ in range(200):
        slow = rng.random() < 0.3  # rank 2 comes and goes as a straggler
        history.append(per_sample_interval([1e-3, 1e-3, 1.6e-3 if slow else 1e-3, 1.1e-3]))
        before = {e.rank for e in detect_stragglers(history[:-1])}
        expected = tuple(e for e in detect_stragglers(history) if e.rank not in before)
        assert new_stragglers(history) == expected
        new += len(expected)
    assert new > 5, "the history never raised a new straggler"
