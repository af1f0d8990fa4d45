"""Job state transitions (pure): failures restart while restarts are left, then fail;
exits while restarting are confirmations; a lost node's ranks are gone at once."""

from __future__ import annotations

from hetero.coordinator import lifecycle as lc
from hetero.coordinator.lifecycle import RankStatus

RUNNING2 = [RankStatus(0, lc.RUNNING), RankStatus(1, lc.RUNNING)]


def test_ranks_running_then_all_exited_zero_succeeds() -> None:
    assert lc.job_state(lc.PENDING, RUNNING2).state == lc.RUNNING
    done = [RankStatus(0, lc.EXITED, 0), RankStatus(1, lc.EXITED, 0)]
    assert lc.job_state(lc.RUNNING, done) == lc.Transition(lc.SUCCEEDED)


def test_a_failed_rank_restarts_while_restarts_are_left_and_says_why() -> None:
    ranks = [RankStatus(0, lc.RUNNING), RankStatus(1, lc.EXITED, 137, "watchdog: no progress")]
    t = lc.job_state(lc.RUNNING, ranks, restarts=0, max_restarts=2)
    assert t.state == lc.RESTARTING and t.restart
    assert t.message == "restart 1 of 2: rank 1 exited with code 137 (watchdog: no progress)"
    last = lc.job_state(lc.RUNNING, ranks, restarts=2, max_restarts=2)
    assert last.state == lc.FAILED and not last.restart
    assert "no restart left (2 used)" in last.message


def test_without_max_restarts_a_failure_fails_with_the_old_message() -> None:
    ranks = [RankStatus(0, lc.RUNNING), RankStatus(1, lc.EXITED, 1)]
    assert lc.job_state(lc.RUNNING, ranks) == lc.Transition(lc.FAILED, "rank 1 exited with code 1")


def test_exits_while_restarting_are_confirmations_not_new_failures() -> None:
    ranks = [RankStatus(0, lc.EXITED, 143), RankStatus(1, lc.EXITED, 137)]
    assert lc.job_state(lc.RESTARTING, ranks, 1, 3) == lc.Transition(lc.RESTARTING)
    assert lc.ready_to_replace(ranks)
    assert not lc.ready_to_replace([RankStatus(0, lc.STOPPING), RankStatus(1, lc.EXITED, 1)])


def test_finished_jobs_never_change() -> None:
    for state in lc.FINISHED:
        assert lc.job_state(state, [RankStatus(0, lc.EXITED, 1)], 0, 5).state == state
        assert lc.node_lost(state, "n", [RankStatus(0, lc.RUNNING)], 0, 5).state == state


def test_a_lost_node_with_live_ranks_restarts_the_job_and_names_them() -> None:
    t = lc.node_lost(
        lc.RUNNING, "node-b", [RankStatus(2, lc.RUNNING), RankStatus(1, lc.RUNNING)], 0, 1
    )
    assert t.state == lc.RESTARTING and t.restart
    assert t.message == "restart 1 of 1: node node-b went down (ranks 1, 2)"
    exhausted = lc.node_lost(lc.RUNNING, "node-b", [RankStatus(1, lc.RUNNING)], 1, 1)
    assert exhausted.state == lc.FAILED


def test_a_lost_node_whose_ranks_already_exited_changes_nothing() -> None:
    t = lc.node_lost(lc.RUNNING, "node-b", [RankStatus(1, lc.EXITED, 0)], 0, 1)
    assert t == lc.Transition(lc.RUNNING)


def test_rank_states_after_a_stop_order_and_after_a_lost_node() -> None:
    assert lc.rank_state_after_cancel(lc.ASSIGNED) == lc.EXITED
    assert lc.rank_state_after_cancel(lc.RUNNING) == lc.STOPPING
    for state in (lc.ASSIGNED, lc.RUNNING, lc.STOPPING):
        assert lc.rank_state_when_node_lost(state) == lc.EXITED, "never wait for a lost node"


def test_restart_world_sizes_try_the_full_size_first_then_fewer_down_to_one() -> None:
    assert list(lc.restart_world_sizes(3)) == [3, 2, 1]
