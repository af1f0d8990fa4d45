"""The pipeline partitioner (``hetero.core.stages``): exact against every split, memory
always kept, the even split where devices and blocks are alike, monotone in speed and
memory."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero.core.errors import PlanError
from hetero.core.stages import (
    Device,
    Model,
    PartCost,
    Pipeline,
    Schedule,
    balanced_stage_seconds,
    even_partition,
    ideal_step_seconds,
    measured_speeds,
    partition,
    stage_cost,
    step_seconds,
)

MB = 2**20

parts = st.builds(
    PartCost,
    seconds=st.floats(0.001, 1.0),
    state_bytes=st.floats(0, 100 * MB),
    activation_bytes=st.floats(0, 10 * MB),
)
devices = st.builds(Device, speed=st.floats(0.2, 5.0), capacity_bytes=st.floats(50 * MB, 2000 * MB))
pipes = st.builds(
    Pipeline,
    microbatches=st.integers(1, 8),
    microbatch=st.integers(1, 4),
    schedule=st.sampled_from(Schedule),
)


@st.composite
def problems(draw: st.DrawFn) -> tuple[Model, list[Device], Pipeline]:
    stages = draw(st.integers(1, 4))
    blocks = draw(st.lists(parts, min_size=stages, max_size=8))
    model = Model(tuple(blocks), head=draw(parts), tail=draw(parts))
    return model, draw(st.lists(devices, min_size=stages, max_size=stages)), draw(pipes)


def splits(n: int, s: int) -> list[tuple[int, ...]]:
    return [(0, *cuts, n) for cuts in itertools.combinations(range(1, n), s - 1)]


def brute_force(model: Model, devs: list[Device], pipe: Pipeline) -> float:
    """The least bottleneck over every contiguous split that fits (inf: none fits)."""
    best = math.inf
    for bounds in splits(len(model.blocks), len(devs)):
        costs = [
            stage_cost(model, devs, pipe, j, bounds[j], bounds[j + 1]) for j in range(len(devs))
        ]
        if all(
            peak <= d.capacity_bytes * (1 - pipe.margin)
            for (_, peak), d in zip(costs, devs, strict=True)
        ):
            best = min(best, max(secs for secs, _ in costs))
    return best


@given(problems())
def test_partition_is_the_least_bottleneck_of_every_split_that_fits(
    problem: tuple[Model, list[Device], Pipeline],
) -> None:
    model, devs, pipe = problem
    best = brute_force(model, devs, pipe)
    if best == math.inf:
        with pytest.raises(PlanError, match="fits their memory"):
            partition(model, devs, pipe)
        return
    got = partition(model, devs, pipe)
    assert got.bottleneck == best
    assert got.bounds[0] == 0 and got.bounds[-1] == len(model.blocks)
    assert all(size >= 1 for size in got.sizes)
    for peak, d in zip(got.stage_peak_bytes, devs, strict=True):
        assert peak <= d.capacity_bytes * (1 - pipe.margin)


@given(st.integers(1, 5), st.integers(1, 6), st.floats(0.01, 1.0), pipes)
def test_alike_devices_and_alike_blocks_give_the_even_split(
    stages: int, per_stage: int, seconds: float, pipe: Pipeline
) -> None:
    model = Model((PartCost(seconds, MB, MB),) * (stages * per_stage))
    devs = [Device(1.0, 2**40)] * stages
    assert partition(model, devs, pipe).sizes == (per_stage,) * stages


@given(st.integers(2, 4), st.integers(0, 3), pipes)
def test_alike_devices_with_blocks_left_over_differ_by_one_block_at_most(
    stages: int, extra: int, pipe: Pipeline
) -> None:
    model = Model((PartCost(0.1, MB, MB),) * (2 * stages + extra % stages))
    sizes = partition(model, [Device(1.0, 2**40)] * stages, pipe).sizes
    assert max(sizes) - min(sizes) <= 1


def test_a_twice_as_fast_device_takes_twice_the_blocks() -> None:
    model = Model((PartCost(0.1, MB, MB),) * 12)
    devs = [Device(2.0, 2**40), Device(1.0, 2**40)]
    got = partition(model, devs, Pipeline(4, 1))
    assert got.sizes == (8, 4)
    even = even_partition(model, devs, Pipeline(4, 1))
    assert even.sizes == (6, 6) and even.bottleneck == pytest.approx(1.5 * got.bottleneck)
    # Blocks divide exactly in proportion to speed: the split is the ideal's.
    assert step_seconds(got.stage_seconds, 4) == pytest.approx(ideal_step_seconds(model, devs, 4))


@given(problems(), st.integers(0, 3), st.floats(1.0, 4.0))
def test_a_faster_device_never_makes_the_bottleneck_worse(
    problem: tuple[Model, list[Device], Pipeline], which: int, factor: float
) -> None:
    model, devs, pipe = problem
    i = which % len(devs)
    faster = [*devs[:i], Device(devs[i].speed * factor, devs[i].capacity_bytes), *devs[i + 1 :]]
    try:
        before = partition(model, devs, pipe).bottleneck
    except PlanError:
        return
    assert partition(model, faster, pipe).bottleneck <= before


@given(problems(), st.integers(0, 3), st.floats(1.0, 4.0))
def test_more_memory_never_loses_a_split_nor_slows_it(
    problem: tuple[Model, list[Device], Pipeline], which: int, factor: float
) -> None:
    model, devs, pipe = problem
    i = which % len(devs)
    bigger = [*devs[:i], Device(devs[i].speed, devs[i].capacity_bytes * factor), *devs[i + 1 :]]
    try:
        before = partition(model, devs, pipe).bottleneck
    except PlanError:
        return
    assert partition(model, bigger, pipe).bottleneck <= before


@given(problems())
def test_no_split_beats_the_balanced_stages_and_the_step_grows_with_the_bottleneck(
    problem: tuple[Model, list[Device], Pipeline],
) -> None:
    model, devs, pipe = problem
    try:
        got = partition(model, devs, pipe)
    except PlanError:
        return
    step = step_seconds(got.stage_seconds, pipe.microbatches)
    assert got.bottleneck >= balanced_stage_seconds(model, devs) * (1 - 1e-9)
    assert step >= pipe.microbatches * got.bottleneck * (1 - 1e-9)


def test_gpipe_holds_every_microbatch_and_1f1b_fewer_on_later_stages() -> None:
    gpipe, one = Pipeline(8, 2, Schedule.GPIPE), Pipeline(8, 2, Schedule.ONE_F_ONE_B)
    assert [gpipe.in_flight(i, 3) for i in range(3)] == [8, 8, 8]
    assert [one.in_flight(i, 3) for i in range(3)] == [3, 2, 1]


def test_a_model_too_big_for_its_stages_is_one_line_naming_the_need() -> None:
    model = Model((PartCost(0.1, 10 * 2**30, 0),) * 4)
    with pytest.raises(PlanError) as err:
        partition(model, [Device(1.0, 8 * 2**30)] * 2, Pipeline(4, 1))
    assert "\n" not in str(err.value) and "40.00 GiB" in str(err.value)


def test_memory_moves_blocks_off_a_fast_device_that_cannot_hold_them() -> None:
    model = Model((PartCost(0.1, 2**30, 0),) * 8)
    roomy = partition(model, [Device(3.0, 2**40), Device(1.0, 2**40)], Pipeline(4, 1, margin=0))
    assert roomy.sizes == (6, 2)
    small = partition(model, [Device(3.0, 4 * 2**30), Device(1.0, 2**40)], Pipeline(4, 1, margin=0))
    assert small.sizes == (4, 4)


def test_fewer_blocks_than_stages_is_refused() -> None:
    with pytest.raises(PlanError, match="at least 3 blocks"):
        partition(Model((PartCost(0.1, 0, 0),) * 2), [Device(1.0, 2**40)] * 3, Pipeline(1, 1))


@given(problems())
def test_speeds_read_back_from_a_split_s_stage_times_are_the_devices_speeds(
    problem: tuple[Model, list[Device], Pipeline],
) -> None:
    model, devs, pipe = problem
    try:
        got = partition(model, devs, pipe)
    except PlanError:
        return
    speeds = measured_speeds(model, got.bounds, got.stage_seconds)
    assert speeds == pytest.approx([d.speed for d in devs], rel=1e-9)


def test_a_stage_measured_slower_than_profiled_loses_blocks_on_the_next_cut() -> None:
    model = Model((PartCost(0.1, MB, MB),) * 12)
    alike = [Device(1.0, 2**40)] * 2
    first = partition(model, alike, Pipeline(4, 1))
    assert first.sizes == (6, 6)
    # The second device turned out twice as slow: 0.6 s of blocks took 1.2 s.
    speeds = measured_speeds(model, first.bounds, (0.6, 1.2))
    again = partition(model, [Device(s, 2**40) for s in speeds], Pipeline(4, 1))
    assert again.sizes == (8, 4)
