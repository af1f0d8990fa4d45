"""Pipeline replicas (``hetero.core.pipeplan``): every rank holds one stage of one replica,
the devices a split is cut for, the microbatch, and re-cuts that pay for themselves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero.core.balancer import Horizon
from hetero.core.errors import ConfigError
from hetero.core.pipeplan import Layout, microbatch_for, recut, stage_devices
from hetero.core.stages import Device, Model, PartCost, Pipeline, partition


@given(st.integers(1, 8), st.integers(1, 8))
def test_each_rank_is_one_stage_of_one_replica(stages: int, replicas: int) -> None:
    layout = Layout(stages, stages * replicas)
    assert layout.replicas == replicas
    for rank in range(layout.world_size):
        replica, stage = layout.replica_of(rank), layout.stage_of(rank)
        assert layout.replica_ranks(replica)[stage] == rank
        assert set(layout.replica_ranks(replica)) & set(layout.stage_ranks(stage)) == {rank}
    assert sorted(r for k in range(replicas) for r in layout.replica_ranks(k)) == list(
        range(layout.world_size)
    )


def test_stages_that_do_not_divide_the_ranks_are_one_line() -> None:
    with pytest.raises(ConfigError, match="3 stages do not divide 4 ranks"):
        Layout(3, 4)


def test_a_stage_is_cut_for_its_replicas_harmonic_speed_and_least_memory() -> None:
    # Ranks 0, 1: replica 0's stages; 2, 3: replica 1's.
    devices = stage_devices([1.0, 2.0, 3.0, 2.0], [10.0, 20.0, 30.0, 5.0], Layout(2, 4))
    assert [d.speed for d in devices] == pytest.approx([1.5, 2.0])
    assert [d.capacity_bytes for d in devices] == [10.0, 5.0]


@given(st.integers(1, 4096), st.integers(1, 16), st.integers(1, 64))
def test_the_microbatch_divides_the_batch_and_leaves_every_replica_one(
    batch: int, replicas: int, wanted: int
) -> None:
    if batch < replicas:
        with pytest.raises(ConfigError):
            microbatch_for(batch, replicas, wanted)
        return
    mu = microbatch_for(batch, replicas, wanted)
    assert 1 <= mu <= wanted and batch % mu == 0 and batch // mu >= replicas
    # The largest such: no larger divisor within the bounds was passed over.
    assert not any(batch % m == 0 and batch // m >= replicas for m in range(mu + 1, wanted + 1))


BLOCK = PartCost(0.01, 0.0, 0.0)
MODEL = Model((BLOCK,) * 12)
PIPE = Pipeline(microbatches=8, microbatch=4)
ROOM = [2.0**40, 2.0**40]


def test_a_split_already_right_for_the_measured_speeds_stays() -> None:
    # 6 + 6 blocks measured at 60 ms each: alike devices, the split is the best.
    got = recut(MODEL, (0, 6, 12), [0.06, 0.06], ROOM, PIPE, horizon=Horizon(100), move_s=0.0)
    assert got.partition is None
    assert got.new_s == got.now_s


def test_a_stage_that_slowed_moves_blocks_when_the_move_pays() -> None:
    # Stage 1 now takes twice as long: 8 + 4 evens the stages out.
    got = recut(MODEL, (0, 6, 12), [0.06, 0.12], ROOM, PIPE, horizon=Horizon(100), move_s=1.0)
    assert got.partition is not None
    assert got.partition.sizes == (8, 4)
    assert got.new_s < got.now_s
    assert "pays for itself" in got.reason


def test_a_move_dearer_than_its_gain_over_the_horizon_is_not_made() -> None:
    slowed = [0.06, 0.12]
    short = recut(MODEL, (0, 6, 12), slowed, ROOM, PIPE, horizon=Horizon(10, 5), move_s=30.0)
    assert short.partition is None
    assert "does not pay" in short.reason
    # The same move pays where the job runs long enough.
    long = recut(MODEL, (0, 6, 12), slowed, ROOM, PIPE, horizon=Horizon(1000), move_s=30.0)
    assert long.partition is not None
    # What it gains a step times the steps it runs, beyond the dead band, beats the cost.
    assert (long.now_s - long.new_s - 0.02 * long.now_s) * 10_000 > 30.0


def test_a_gain_within_the_dead_band_is_noise() -> None:
    # 1% slower on one stage: a re-cut of one block would gain less than the band.
    got = recut(
        Model((BLOCK,) * 64),
        (0, 32, 64),
        [0.32, 0.3232],
        ROOM,
        PIPE,
        horizon=Horizon(10**6),
        move_s=0.0,
    )
    assert got.partition is None


@given(st.floats(0.2, 5.0), st.floats(0.2, 5.0))
def test_the_recut_is_the_partition_for_the_speeds_read_back(slow0: float, slow1: float) -> None:
    measured = [6 * 0.01 * slow0, 6 * 0.01 * slow1]
    got = recut(MODEL, (0, 6, 12), measured, ROOM, PIPE, horizon=Horizon(10**6), move_s=0.0)
    best = partition(MODEL, [Device(1 / slow0, ROOM[0]), Device(1 / slow1, ROOM[1])], PIPE)
    if got.partition is not None:
        assert got.partition.bounds == best.bounds
    else:
        assert best.bounds == (0, 6, 12) or got.now_s - got.new_s <= 0.02 * got.now_s + 1e-12
