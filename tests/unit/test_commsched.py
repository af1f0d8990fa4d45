"""The comm schedule: ``auto`` plans in deferred, tries overlap once a plan settles, keeps
the faster, and returns to deferred when the plan or the step time moves."""

from __future__ import annotations

import pytest

from hetero.core.errors import ConfigError
from hetero.trainer.commsched import (
    AutoComm,
    FixedComm,
    check_comm,
    comm_policy,
    mode_code,
    mode_of,
)
from hetero.trainer.gradients import DEFERRED, MODES, OVERLAP

PLAN = (176, 80)


def _settle(auto: AutoComm, step_s: float = 0.086, plan: tuple[int, ...] = PLAN) -> str:
    """Feed deferred intervals at ``plan`` until auto asks for a trial; return that mode."""
    modes = [auto.next_mode(plan, step_s, False)[0] for _ in range(auto.settle_intervals)]
    assert modes[:-1] == [DEFERRED] * (auto.settle_intervals - 1)
    return modes[-1]


def test_auto_tries_overlap_only_after_the_plan_ran_unchanged_for_the_settle_intervals():
    auto = AutoComm(settle_intervals=2)
    assert auto.next_mode(PLAN, 0.086, False) == (
        DEFERRED,
        "deferred: plan settling (1/2 intervals)",
    )
    mode, reason = auto.next_mode(PLAN, 0.084, False)
    assert mode == OVERLAP and "trial" in reason and "85.0 ms" in reason


def test_auto_keeps_overlap_when_the_trial_is_faster_beyond_the_margin():
    auto = AutoComm(margin=0.01)
    assert _settle(auto, 0.086) == OVERLAP
    mode, reason = auto.next_mode(PLAN, 0.0830, False)
    assert mode == OVERLAP and reason.startswith("overlap kept: overlap 83.0 ms vs deferred 86.0")
    # It stays while the step time holds...
    assert auto.next_mode(PLAN, 0.0835, False)[0] == OVERLAP


def test_auto_keeps_deferred_on_a_tie_or_a_slower_trial():
    for trial_s in (0.0855, 0.090):  # within the 1% margin, and slower
        auto = AutoComm(margin=0.01)
        _settle(auto, 0.086)
        mode, reason = auto.next_mode(PLAN, trial_s, False)
        assert mode == DEFERRED and reason.startswith("deferred kept")
        # ...and does not try again while the plan holds.
        assert [auto.next_mode(PLAN, 0.05, False)[0] for _ in range(5)] == [DEFERRED] * 5


def test_a_plan_change_sends_auto_back_to_deferred_and_it_tries_again_after_settling():
    auto = AutoComm()
    _settle(auto)
    auto.next_mode(PLAN, 0.080, False)  # overlap kept
    mode, reason = auto.next_mode(PLAN, 0.080, True)
    assert (mode, reason) == (DEFERRED, "plan changed: deferred until it settles")
    new = (180, 76)
    assert auto.next_mode(PLAN, 0.090, False)[0] == DEFERRED  # interval still on the old plan
    assert auto.next_mode(new, 0.085, False)[0] == DEFERRED  # first at the new plan
    assert auto.next_mode(new, 0.085, False)[0] == OVERLAP  # settled: a new trial


def test_a_step_time_that_moves_in_overlap_sends_auto_back_to_deferred():
    auto = AutoComm(drift=0.10)
    _settle(auto, 0.086)
    auto.next_mode(PLAN, 0.080, False)
    assert auto.next_mode(PLAN, 0.087, False)[0] == OVERLAP  # +9%: noise
    mode, reason = auto.next_mode(PLAN, 0.120, False)  # a neighbour arrived
    assert mode == DEFERRED and "80.0 -> 120.0 ms" in reason
    # It measures again at the same plan before trying overlap again.
    assert auto.next_mode(PLAN, 0.120, False)[0] == DEFERRED
    assert auto.next_mode(PLAN, 0.120, False)[0] == OVERLAP


def test_an_unmeasured_or_moved_trial_is_inconclusive():
    auto = AutoComm()
    _settle(auto)
    mode, reason = auto.next_mode(None, None, False)
    assert mode == DEFERRED and "inconclusive" in reason
    auto = AutoComm()
    _settle(auto)
    assert auto.next_mode((170, 86), 0.05, False)[0] == DEFERRED


def test_the_reference_is_the_median_of_the_newest_deferred_intervals():
    auto = AutoComm(settle_intervals=3, reference_intervals=3, margin=0.0)
    for s in (0.200, 0.090, 0.092):
        mode, _ = auto.next_mode(PLAN, s, False)
    assert mode == OVERLAP
    # Median 0.092, not the mean (0.127) the slow first interval would drag up.
    assert auto.next_mode(PLAN, 0.095, False)[0] == DEFERRED


def test_no_trial_while_the_planner_may_still_move_the_plan():
    # A trial interval never reaches the planner: while it still converges (a jump
    # waiting for confirmation, a move near its threshold) the trial waits.
    auto = AutoComm(settle_intervals=2)
    auto.next_mode(PLAN, 0.086, False)
    for _ in range(3):
        mode, reason = auto.next_mode(PLAN, 0.086, False, settled=False)
        assert (mode, reason) == (
            DEFERRED,
            "deferred: the planner may still move the plan (no trial yet)",
        )
    assert auto.next_mode(PLAN, 0.086, False, settled=True)[0] == OVERLAP


def test_a_plan_held_past_the_patience_gets_its_trial_though_a_move_is_pending():
    """Two nodes over a 2 Gbit/s link: the planner held the plan with +0.6% predicted
    against 1.0% needed for 7 intervals, never settled, and every deferred interval
    exposed the whole all-reduce (0.89x plain DDP)."""
    auto = AutoComm(settle_intervals=2, patience_intervals=3)
    modes = [auto.next_mode(PLAN, 0.560, False, settled=False) for _ in range(5)]
    assert [m for m, _ in modes] == [DEFERRED] * 4 + [OVERLAP]
    assert modes[-1][1] == (
        "trial of overlap: plan unchanged for 5 intervals, the planner's pending move "
        "not made, deferred step 560.0 ms"
    )
    assert auto.next_mode(PLAN, 0.470, False, settled=False)[0] == OVERLAP, "kept: faster"


def test_an_exposed_all_reduce_worth_a_tenth_of_the_step_gets_its_trial_at_once():
    """The same link: the slowest rank waited 414 ms a step for the all-reduce after a
    93 ms backward, which overlap may hide: the trial comes as soon as the plan has
    run its settle intervals, not after the patience."""
    auto = AutoComm(settle_intervals=2, patience_intervals=3)
    first = auto.next_mode(PLAN, 0.566, False, settled=False, hideable_s=0.093)
    assert first == (DEFERRED, "deferred: plan settling (1/2 intervals)")
    mode, reason = auto.next_mode(PLAN, 0.566, False, settled=False, hideable_s=0.093)
    assert (mode, reason) == (
        OVERLAP,
        "trial of overlap: plan unchanged for 2 intervals, overlap may hide 93.0 ms of "
        "the all-reduce a step, deferred step 566.0 ms",
    )
    small = AutoComm(settle_intervals=2, patience_intervals=3)
    small.next_mode(PLAN, 0.086, False, settled=False, hideable_s=0.004)
    assert small.next_mode(PLAN, 0.086, False, settled=False, hideable_s=0.004)[0] == DEFERRED


def test_a_trial_must_beat_the_deferred_intervals_by_more_than_their_noise():
    # On a loaded host deferred intervals at one plan spread by ~7%: a trial 3.5% faster
    # is noise, and keeping overlap on it would withhold every later interval from the
    # planner until the step time moved by 10%.
    noisy = AutoComm(settle_intervals=3, margin=0.01)
    for s in (0.080, 0.092, 0.086):
        mode, _ = noisy.next_mode(PLAN, s, False)
    assert mode == OVERLAP
    mode, reason = noisy.next_mode(PLAN, 0.083, False)
    assert mode == DEFERRED and reason.startswith("deferred kept")
    quiet = AutoComm(settle_intervals=3, margin=0.01)
    for s in (0.0858, 0.0862, 0.0860):
        quiet.next_mode(PLAN, s, False)
    assert quiet.next_mode(PLAN, 0.083, False)[0] == OVERLAP


def test_unmeasured_intervals_do_not_count_toward_settling():
    auto = AutoComm(settle_intervals=2)
    assert auto.next_mode(None, None, False)[0] == DEFERRED
    assert auto.next_mode(PLAN, 0.0, False)[0] == DEFERRED
    assert auto.next_mode(PLAN, 0.08, False)[0] == DEFERRED
    assert auto.next_mode(PLAN, 0.08, False)[0] == OVERLAP


def test_fixed_modes_never_change():
    for mode in MODES:
        fixed = comm_policy(mode)
        assert isinstance(fixed, FixedComm)
        assert {fixed.next_mode(PLAN, s, c)[0] for s in (0.05, 0.2) for c in (False, True)} == {
            mode
        }
    assert isinstance(comm_policy("auto"), AutoComm)


def test_comm_choices_are_checked_and_modes_round_trip_through_their_codes():
    assert check_comm("deferred") == "deferred"
    with pytest.raises(
        ConfigError, match=r"comm: unknown value .eager. \(known: auto, overlap, deferred\)"
    ):
        check_comm("eager")
    assert [mode_of(mode_code(m)) for m in MODES] == list(MODES)
