"""DataLoader workers in proportion to a rank's share of its node, with hysteresis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.core.errors import ConfigError
from hetero.trainer.prefetch import tensors_in, to_device
from hetero.trainer.workerscale import WorkerShare


def test_the_node_budget_is_split_in_proportion_to_the_local_batches():
    # Ranks 0 and 2 share a host; rank 1 is elsewhere and does not count.
    plan = (150, 999, 50)
    assert WorkerShare(6, (0, 2), 0).initial(plan) == 9  # 12 x 150/200
    assert WorkerShare(6, (0, 2), 2).initial(plan) == 3
    assert WorkerShare(6, (1,), 1).initial(plan) == 6  # alone on its host


def test_a_rank_keeps_at_least_one_worker_and_none_when_none_were_asked_for():
    assert WorkerShare(2, (0, 1, 2), 2).initial((60, 38, 2)) == 1  # 6 x 2/100 = 0.12
    assert WorkerShare(0, (0, 1), 0).initial((90, 10)) == 0
    assert WorkerShare(0, (0, 1), 0).next_count((10, 90), 0) == 0


def test_the_count_moves_only_beyond_the_hysteresis():
    share = WorkerShare(3, (0, 1), 0, hysteresis=0.25)  # budget 6
    assert share.next_count((50, 50), 3) == 3
    assert share.next_count((62, 38), 3) == 3  # target 3.72: within 0.75
    assert share.next_count((63, 37), 3) == 4  # target 3.78
    assert share.next_count((40, 60), 3) == 3  # target 2.4: within 0.75
    assert share.next_count((35, 65), 3) == 2  # target 2.1


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8),
    st.lists(st.integers(1, 300), min_size=1, max_size=6),
    st.integers(0, 20),
)
def test_counts_stay_near_the_target_and_a_changed_count_is_the_rounded_target(
    workers, local_batches, current
):
    peers = tuple(range(len(local_batches)))
    for rank in peers:
        share = WorkerShare(workers, peers, rank)
        target = share.target(local_batches)
        count = share.next_count(local_batches, max(current, 1))
        assert count >= 1
        if count != max(current, 1):
            assert count == max(1, round(target))
        assert abs(count - target) <= 0.75 or count == 1


def test_a_rank_outside_its_peers_is_an_error():
    with pytest.raises(ConfigError, match="not among its node's ranks"):
        WorkerShare(2, (0, 1), 3)


def test_to_device_keeps_any_nesting_and_finds_every_tensor():
    import collections

    import torch

    Pair = collections.namedtuple("Pair", "x y")
    batch = {"a": [torch.ones(2), (torch.zeros(1), "label")], "b": Pair(torch.ones(3), 7)}
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved["b"], Pair) and moved["b"].y == 7
    assert isinstance(moved["a"], list) and moved["a"][1][1] == "label"
    assert [t.numel() for t in tensors_in(moved)] == [2, 1, 3]
