"""hetero-bench run's figures on synthetic metrics: steady window, imbalance, adaptation, phases."""

from __future__ import annotations

import pytest

from hetero.bench.harness import figures
from hetero.bench.harness.figures import Phase


def test_steady_window_is_the_latter_half_and_never_empty_for_a_nonempty_phase() -> None:
    assert figures.steady_window(0, 10) == range(5, 10)
    assert figures.steady_window(4, 9) == range(6, 9)
    assert figures.steady_window(3, 4) == range(3, 4)
    assert len(figures.steady_window(5, 5)) == 0


def test_median_rate_ignores_the_transient_before_the_window() -> None:
    rates = [10.0, 50.0, 90.0, 100.0, 101.0, 99.0]
    assert figures.median_rate(rates, figures.steady_window(0, 6)) == 100.0
    assert figures.median_rate(rates, range(0)) is None


def test_whole_run_rate_is_samples_over_seconds_without_the_first_interval() -> None:
    # Intervals after the first: 100 samples/s for 1 s and 200 samples/s for 3 s -> 700/4.
    assert figures.whole_run_rate([1.0, 100.0, 200.0], [9.0, 1.0, 3.0]) == pytest.approx(175.0)


def test_imbalance_is_max_over_mean_minus_one_median_over_the_window() -> None:
    assert figures.interval_imbalance([1.0, 1.0]) == 0.0
    assert figures.interval_imbalance([1.0, 3.0]) == pytest.approx(0.5)
    assert figures.interval_imbalance([1.0, None]) is None  # plain DDP: no compute-only time
    per_interval = [[1.0, 5.0], [1.0, 1.0], [1.0, 1.2], [1.0, 1.4]]
    assert figures.imbalance(per_interval, range(1, 4)) == pytest.approx(0.2 / 2.2)
    assert figures.imbalance([[None, None]], range(1)) is None


def test_phases_cut_at_the_first_interval_containing_each_change() -> None:
    steps = [10, 20, 30, 40, 50, 60]
    ph = figures.phases(steps, [(20, "arrives"), (40, "leaves")])
    # Change at step 20: interval 30 (steps 20..29) is the first containing it.
    assert ph == [Phase(0, 2, "start"), Phase(2, 4, "arrives"), Phase(4, 6, "leaves")]
    # A change between boundaries starts its phase at the mixed interval.
    assert figures.phases(steps, [(25, "x")])[1] == Phase(2, 6, "x")
    # A change after the last interval is dropped.
    assert figures.phases(steps, [(60, "late")]) == [Phase(0, 6, "start")]


def test_adaptation_counts_intervals_until_within_5pct_for_two_intervals() -> None:
    # Steady 100 before; the change at interval 4 halves the target to 50.
    rates = [100, 100, 100, 100, 80, 60, 52, 50, 49, 50, 51, 50]
    ph = Phase(4, 12, "slowdown")
    assert figures.adaptation_intervals(rates, ph) == 2  # 52 and 50 are within 5% of 50
    # A policy that is at its new level at once adapts in 0 intervals.
    assert figures.adaptation_intervals([100, 100, 50, 50, 50, 50], Phase(2, 6, "x")) == 0
    # One lucky interval inside the band is not settling.
    rates2 = [100, 100, 50, 80, 50, 50, 50, 50]
    assert figures.adaptation_intervals(rates2, Phase(1, 8, "x")) == 3
    assert figures.adaptation_intervals([], Phase(0, 0, "empty")) is None


def test_adaptation_is_none_when_the_throughput_never_settles() -> None:
    rates = [100, 50, 150, 50, 150, 50, 150, 50]
    assert figures.adaptation_intervals(rates, Phase(0, 8, "noisy"), tol=0.05) is None


def test_mean_utilization_averages_per_gpu_inside_the_span_and_skips_unknowns() -> None:
    samples = [(0.0, [0.0, 0.0]), (1.0, [80.0, None]), (2.0, [100.0, 40.0]), (9.0, [0.0, 0.0])]
    assert figures.mean_utilization(samples, 1.0, 2.0) == [90.0, 40.0]
    assert figures.mean_utilization(samples, 3.0, 4.0) == []
