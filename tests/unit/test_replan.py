"""The re-plan rule is written once (hetero.core.replan) for coordinator and trainer."""

from __future__ import annotations

import random

from hetero.core.balancer import Constraints, RankInterval
from hetero.core.balancer.dynamic import _kept_fit
from hetero.core.replan import HISTORY_WINDOW, is_boundary, replan, running_plan, should_replan
from hetero.core.states import JobState

RULE = dict(
    ran_version=3,
    attempt_first_version=2,
    newest_version=3,
    job_state=JobState.RUNNING,
    end_step=40,
    rebalance_interval=10,
)


def test_boundaries_close_every_interval_and_never_at_step_zero() -> None:
    assert [s for s in range(0, 31) if is_boundary(s, 10)] == [10, 20, 30]


def test_only_a_current_interval_of_the_newest_plan_at_a_boundary_replans() -> None:
    assert should_replan(**RULE)
    assert not should_replan(**{**RULE, "ran_version": 2})  # ran the plan before: stale
    assert not should_replan(**{**RULE, "ran_version": 1, "newest_version": 1})  # an old attempt
    assert not should_replan(**{**RULE, "job_state": JobState.CANCELLED})
    assert not should_replan(**{**RULE, "end_step": 45})


def test_what_the_ranks_ran_counts_only_if_it_is_a_plan() -> None:
    c = Constraints(64, 2, min_batch=4)
    assert running_plan([40, 24], c) == (40, 24)
    assert running_plan([40, 20], c) is None  # not the global batch
    assert running_plan([62, 2], c) is None  # below min_batch
    assert running_plan([64], c) is None  # wrong rank count


def test_the_coordinator_replans_from_the_reported_boundary() -> None:
    fast, slow = RankInterval(0, 32, 10, 0.1), RankInterval(1, 32, 10, 0.3)
    result = replan(
        "dynamic", [(fast, slow)] * (HISTORY_WINDOW + 8), (32, 32), Constraints(64, 2), [], 50
    )
    assert result.apply_at_step == 50
    assert result.decision.changed and result.decision.batches[0] > result.decision.batches[1]


def test_a_report_in_steady_state_fits_the_balancer_once() -> None:
    """What was known before the newest interval is the previous report's fit, kept:
    the fit is most of a report's cost on the coordinator."""
    rng = random.Random(3)
    history = [
        tuple(
            RankInterval(r, 32, 10, 32 * 0.001 * (1 + r) * rng.uniform(0.97, 1.03))
            for r in range(4)
        )
        for _ in range(HISTORY_WINDOW + 12)
    ]
    c = Constraints(128, 4)
    args = ((32,) * 4, c, [], 0)
    first = replan("dynamic", history[: HISTORY_WINDOW + 1], *args)
    fits = _kept_fit.cache_info().misses
    for n in range(HISTORY_WINDOW + 2, len(history) + 1):
        kept = replan("dynamic", history[:n], *args)
        assert _kept_fit.cache_info().misses == fits + 1, f"report {n} fitted more than once"
        fits += 1
        _kept_fit.cache_clear()  # the same decision with nothing kept
        assert replan("dynamic", history[:n], *args) == kept
        fits = _kept_fit.cache_info().misses
    assert first.decision.changed
