"""The per-rank fit: robust to outliers, follows sudden changes, keeps what it knows of c."""

from __future__ import annotations

import pytest

from hetero.core.balancer import find_regimes, fit_rank
from hetero.core.balancer.changepoint import consistent
from hetero.core.balancer.robust_fit import huber_line


def affine(a: float, c: float, batches: list[int]) -> list[tuple[int, float]]:
    return [(b, a * b + c) for b in batches]


def test_huber_line_ignores_one_gross_outlier() -> None:
    points = affine(0.001, 0.02, [64, 96, 128, 160, 192, 224])
    points[2] = (128, 3 * points[2][1])  # a checkpoint save inside that interval
    a, c = huber_line(points, [1.0] * len(points))
    assert a == pytest.approx(0.001, rel=0.02)
    assert c == pytest.approx(0.02, rel=0.1)


def test_fit_recovers_per_sample_and_fixed_cost_when_batches_spread() -> None:
    fit = fit_rank(affine(0.0005, 0.04, [128, 115, 112, 112, 113, 112]))
    assert fit.model.per_sample_s == pytest.approx(0.0005, rel=1e-6)
    assert fit.model.fixed_s == pytest.approx(0.04, rel=1e-6)
    assert fit.fixed_from == "regime"


def test_fit_without_spread_passes_through_the_newest_point_with_zero_fixed_cost() -> None:
    fit = fit_rank(affine(0.0005, 0.04, [128] * 5))
    assert fit.fixed_from == "none"
    assert fit.model.fixed_s == 0.0
    assert fit.model.time(128) == pytest.approx(0.0005 * 128 + 0.04)


def test_a_plan_move_is_not_mistaken_for_a_change_of_speed() -> None:
    # From 256 to 120 samples the time falls by half: explained by some c in [0, t0].
    assert consistent((256, 0.1), (120, 0.06), 0.15)
    assert find_regimes(affine(0.0003, 0.02, [256, 120, 118, 118]), 0.15).starts == (0,)


def test_a_sustained_jump_starts_a_new_regime_and_the_fit_uses_only_it() -> None:
    before = affine(0.0002, 0.01, [200, 180, 176, 176, 176])
    after = affine(0.0005, 0.01, [176, 176])
    fit = fit_rank(before + after)
    assert fit.regime.start == len(before)
    # c came from the earlier regime (which had spread); a from the new points.
    assert fit.fixed_from == "earlier regime"
    assert fit.model.per_sample_s == pytest.approx(0.0005, rel=1e-6)


def test_the_newest_point_alone_is_acted_on_as_a_suspected_change() -> None:
    points = affine(0.0002, 0.01, [176] * 5) + affine(0.0004, 0.01, [176])
    fit = fit_rank(points)
    assert fit.changed_at_newest
    assert fit.model.time(176) == pytest.approx(0.0004 * 176 + 0.01)


def test_a_one_interval_spike_is_an_outlier_once_the_next_interval_is_normal() -> None:
    points = affine(0.0002, 0.01, [176] * 6)
    points[3] = (176, points[3][1] * 2.5)
    fit = fit_rank(points)
    assert fit.regime.starts == (0,)
    assert fit.regime.outliers == (3,)
    assert fit.model.time(176) == pytest.approx(0.0002 * 176 + 0.01)


def test_an_interval_straddling_a_change_is_dropped_and_the_change_starts_after_it() -> None:
    t_old, t_new = 0.05, 0.075
    points = [(176, t_old)] * 4 + [(176, (t_old + t_new) / 2)] + [(176, t_new)] * 2
    regime = find_regimes(points, 0.15)
    assert regime.start == 5
    assert 4 in regime.outliers


def test_slow_drift_never_triggers_a_change() -> None:
    points = [(176, 0.05 * 1.03**k) for k in range(20)]  # +3% per interval, +75% overall
    assert find_regimes(points, 0.15).starts == (0,)


def test_per_sample_cost_ignores_one_slow_interval_among_the_recent_ones() -> None:
    points = affine(0.0002, 0.01, [200, 180, 176, 176, 176, 176, 176, 176])
    points[5] = (176, points[5][1] * 1.12)  # within the change threshold, so not dropped
    fit = fit_rank(points)
    assert fit.model.time(176) == pytest.approx(0.0002 * 176 + 0.01, rel=0.01)


def test_two_levels_of_a_new_regime_measure_its_fixed_cost_where_the_old_one_cannot() -> None:
    # Ten intervals at 256 samples with 4% noise, then a neighbour: 115 ms at 256 and,
    # after one move, 96 ms at 182. Known to 17% of the step, the two levels' fixed cost
    # (48 ms) is the best evidence there is: the old regime, all at one batch, has none,
    # and a proportional fit would make the next move too short.
    noise = [1.0, 1.028, 0.979, 1.021, 0.965, 1.014, 0.986, 1.035, 0.972, 1.0]
    before = [(256, 0.065 * f) for f in noise]
    after = affine(0.000263, 0.0477, [256, 182])
    fit = fit_rank(before + after)
    assert fit.regime.start == len(before)
    assert fit.fixed_from == "regime levels"
    assert fit.model.fixed_s == pytest.approx(0.0477, rel=0.02)


def test_an_interval_that_straddles_a_change_dates_it_but_is_no_level_of_the_new_regime() -> None:
    # 2x H100: a neighbour arrived half-way through an interval at 256 samples; its
    # median was 105 ms (steps spread by 56%) against 148 ms at the new speed. Taken
    # as a level, it and the next point gave a line with a fixed cost near the whole
    # step and the plan overshot.
    before = affine(0.00023, 0.0065, [256] * 6)
    straddle = [(256, 0.105)]
    after = affine(0.000555, 0.0074, [194])
    points = before + straddle + after
    spreads = [0.001] * len(before) + [0.56, 0.004]
    fit = fit_rank(points, spreads=spreads)
    assert fit.regime.start == len(before)  # the change is dated to the straddling interval
    assert len(before) in fit.regime.outliers
    assert fit.model.time(194) == pytest.approx(0.000555 * 194 + 0.0074, rel=1e-6)
    assert fit.model.fixed_s < 0.02
    # Without the steps' spread the straddling point counts as a level of the new speed.
    blind = fit_rank(points)
    assert len(before) not in blind.regime.outliers


def test_a_first_point_of_a_new_regime_with_calm_steps_stays_a_level() -> None:
    before = affine(0.00023, 0.0065, [256] * 6)
    after = affine(0.000555, 0.0074, [256, 194])
    spreads = [0.001] * len(before) + [0.01, 0.004]
    fit = fit_rank(before + after, spreads=spreads)
    assert fit.regime.start == len(before) and not fit.regime.outliers
    assert fit.model.fixed_s == pytest.approx(0.0074, rel=1e-3)
