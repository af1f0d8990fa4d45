"""The rule the coordinator acts on to leave a rank out (``core.balancer.exclusion``)."""

from __future__ import annotations

import pytest

from hetero.core.balancer import Constraints, ExclusionRule, RankInterval
from hetero.core.balancer.exclusion import CONSECUTIVE, MIN_INTERVALS
from hetero.core.errors import ConfigError

COMM_S = 0.003


def _interval(
    batches: tuple[int, ...], slow: float, fixed: float = 0.004, per_sample: float = 0.0002
) -> tuple[RankInterval, ...]:
    """Rank 1 ``slow``x slower; every step has ``fixed`` s of fixed cost and COMM_S exposed."""
    factors = (1.0, slow, *([1.0] * (len(batches) - 2)))
    compute = [(per_sample * b + fixed) * f for b, f in zip(batches, factors, strict=True)]
    wall = max(compute) + COMM_S
    return tuple(
        RankInterval(r, b, 4, t, wall)
        for r, (b, t) in enumerate(zip(batches, compute, strict=True))
    )


def _history(
    n: int, slow: float, batches: tuple[int, ...] = (15, 1), **cost: float
) -> list[tuple[RankInterval, ...]]:
    # The first interval ran another split, so the fit sees two batch sizes per rank.
    first = (batches[0] - 1, batches[1] + 1, *batches[2:])
    return [_interval(first, slow, **cost)] + [_interval(batches, slow, **cost)] * (n - 1)


def test_a_rank_whose_fixed_cost_holds_the_job_back_is_left_out_after_agreeing_intervals() -> None:
    rule = ExclusionRule()
    need = MIN_INTERVALS + CONSECUTIVE - 1
    assert rule.measured(_history(need - 1, slow=8.0), Constraints(16, 2)) is None
    forecast = rule.measured(_history(need, slow=8.0), Constraints(16, 2))
    assert forecast is not None and forecast.excluded == (1,)
    assert forecast.gain > rule.min_gain and forecast.plan_without == (16,)
    assert "no all-reduce with one rank" in forecast.message


def test_a_mildly_slow_rank_that_still_helps_is_kept() -> None:
    # Compute dominates the 3 ms all-reduce: the second rank's 40% share pays.
    history = _history(8, slow=1.5, batches=(10, 6), fixed=0.0005, per_sample=0.002)
    assert ExclusionRule().measured(history, Constraints(16, 2)) is None


def test_a_slowdown_newer_than_the_agreeing_intervals_keeps_the_rank_for_now() -> None:
    history = _history(4, slow=1.0, batches=(8, 8))
    history += [_interval((15, 1), slow=8.0)] * (CONSECUTIVE - 1)
    assert ExclusionRule().measured(history, Constraints(16, 2)) is None
    assert ExclusionRule(consecutive=1).measured(history, Constraints(16, 2)) is not None
    history.append(_interval((15, 1), slow=8.0))  # the CONSECUTIVE-th interval that agrees
    assert ExclusionRule().measured(history, Constraints(16, 2)) is not None


def test_min_gain_is_the_margin_a_restart_must_clear() -> None:
    history = _history(6, slow=8.0)
    forecast = ExclusionRule().measured(history, Constraints(16, 2))
    assert forecast is not None
    assert (
        ExclusionRule(min_gain=forecast.gain + 0.01).measured(history, Constraints(16, 2)) is None
    )


def test_a_one_rank_job_is_never_shrunk() -> None:
    one = [(RankInterval(0, 16, 4, 0.1, 0.1),)] * 6
    assert ExclusionRule().measured(one, Constraints(16, 1)) is None
    assert ExclusionRule().from_profiles([1.0], Constraints(16, 1)) is None


def test_profiles_leave_out_only_a_rank_too_slow_for_min_batch() -> None:
    rule = ExclusionRule()
    assert rule.from_profiles([1.0, 1 / 8], Constraints(16, 2)) is None, "its share is 2 of 16"
    assert rule.from_profiles([1.0, 1.0, 0.5], Constraints(16, 3)) is None
    forecast = rule.from_profiles([1.0, 1 / 40], Constraints(16, 2))
    assert forecast is not None and forecast.rank == 1 and forecast.plan_without == (16,)
    # A larger min_batch makes the same rank hold the job back sooner.
    assert rule.from_profiles([1.0, 1 / 8], Constraints(16, 2, min_batch=4)) is not None


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="consecutive"):
        ExclusionRule(consecutive=0)
    with pytest.raises(ConfigError, match="min_gain"):
        ExclusionRule(min_gain=-0.1)
