"""The uneven-batch sampler: every sample once per epoch under any plan changes; exact resume."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.core.balancer import Box, Constraints, StepModel, equal_time_plan
from hetero.core.errors import ConfigError, PlanError
from hetero.trainer.sampler import UnevenBatchSampler, epoch_permutation


def _random_plan(draw: st.DrawFn, world: int, total: int) -> tuple[int, ...]:
    cuts = sorted(
        draw(
            st.lists(st.integers(1, total - 1), min_size=world - 1, max_size=world - 1, unique=True)
        )
    )
    bounds = [0, *cuts, total]
    return tuple(bounds[i + 1] - bounds[i] for i in range(world))


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[int, int, tuple[int, ...], list[tuple[int, tuple[int, ...]]]]:
    world = draw(st.integers(1, 5))
    global_batch = draw(st.integers(world, 40))
    num_samples = draw(st.integers(global_batch, 200))
    plan0 = _random_plan(draw, world, global_batch) if world > 1 else (global_batch,)
    changes = []
    for _ in range(draw(st.integers(0, 6))):
        step = draw(st.integers(0, 30))
        plan = _random_plan(draw, world, global_batch) if world > 1 else (global_batch,)
        changes.append((step, plan))
    changes.sort(key=lambda c: c[0])
    return num_samples, world, plan0, changes


def _run_epoch(samplers: list[UnevenBatchSampler], changes: list[tuple[int, tuple[int, ...]]]):
    """Iterate one epoch on every rank in lockstep, applying plan changes at their steps."""
    return _take(samplers, samplers[0].steps_per_epoch, changes)


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.booleans())
def test_every_sample_once_per_epoch_under_any_plan_changes(scenario, drop_last):
    num_samples, world, plan0, changes = scenario
    samplers = [
        UnevenBatchSampler(num_samples, plan0, r, seed=7, drop_last=drop_last) for r in range(world)
    ]
    steps = _run_epoch(samplers, changes)
    seen = [i for batch in steps for rank_idx in batch for i in rank_idx]
    assert len(seen) == len(set(seen)), "a sample was duplicated"
    expected = num_samples - samplers[0].dropped_per_epoch
    assert len(seen) == expected
    # What is taken is exactly the head of the epoch's permutation, in order.
    assert seen == epoch_permutation(num_samples, 7, 0)[:expected]
    if not drop_last and num_samples % sum(plan0) >= world:
        assert set(seen) == set(range(num_samples))
    # Each step's sizes follow the plan in force (full steps sum to the global batch).
    for k, batch in enumerate(steps[: num_samples // sum(plan0)]):
        assert sum(len(b) for b in batch) == sum(plan0), f"step {k}"


def _take(samplers, n, changes):
    """``n`` steps on every rank in lockstep, across epochs, applying plan changes."""
    steps, iters, pending = [], None, sorted(changes, key=lambda c: c[0])
    while len(steps) < n:
        if iters is None:
            iters = [iter(s) for s in samplers]
        step = samplers[0].global_step
        while pending and pending[0][0] <= step:
            _, plan = pending.pop(0)
            for s in samplers:
                s.set_plan(plan, step)
        batch = [next(it, None) for it in iters]
        if all(b is None for b in batch):
            iters = None  # every rank finished the epoch together
            continue
        assert all(b is not None for b in batch), "ranks disagree on the end of an epoch"
        steps.append(batch)
    return steps


@settings(max_examples=80, deadline=None)
@given(scenarios(), st.integers(0, 40), st.integers(1, 40))
def test_resume_continues_the_same_order(scenario, stop_after, more):
    num_samples, world, plan0, changes = scenario
    total = stop_after + more
    reference = _take(
        [UnevenBatchSampler(num_samples, plan0, r, seed=3) for r in range(world)], total, changes
    )
    first = [UnevenBatchSampler(num_samples, plan0, r, seed=3) for r in range(world)]
    taken = _take(first, stop_after, [c for c in changes if c[0] < stop_after])
    resumed = [UnevenBatchSampler(num_samples, plan0, r, seed=3) for r in range(world)]
    for s, old in zip(resumed, first, strict=True):
        s.load_state_dict(old.state_dict())
    rest = _take(resumed, more, [c for c in changes if c[0] >= stop_after])
    assert taken + rest == reference


def test_plan_scheduled_behind_the_sampler_is_refused():
    s = UnevenBatchSampler(100, (5, 5), 0)
    it = iter(s)
    next(it), next(it)
    with pytest.raises(PlanError, match="prefetch depth"):
        s.set_plan((7, 3), 1)
    s.set_plan((7, 3), 2)
    assert len(next(it)) == 7


def test_bad_inputs_name_the_problem():
    with pytest.raises(ConfigError, match="larger than the dataset"):
        UnevenBatchSampler(10, (8, 8), 0)
    with pytest.raises(ConfigError, match="empty"):
        UnevenBatchSampler(0, (1,), 0)
    s = UnevenBatchSampler(100, (5, 5), 0)
    with pytest.raises(PlanError, match="global batch"):
        s.set_plan((5, 6), 0)
    other = UnevenBatchSampler(100, (5, 5), 0, seed=1)
    with pytest.raises(ConfigError, match="seed"):
        other.load_state_dict(s.state_dict())


def test_permutation_is_identical_across_calls_and_differs_by_epoch():
    assert epoch_permutation(50, 1, 0) == epoch_permutation(50, 1, 0)
    assert epoch_permutation(50, 1, 0) != epoch_permutation(50, 1, 1)


@settings(max_examples=60, deadline=None)
@given(
    old_world=st.integers(1, 5),
    new_world=st.integers(1, 5),
    stop_after=st.integers(0, 9),
    more=st.integers(1, 10),
)
def test_resume_with_another_world_size_continues_the_same_global_order(
    old_world: int, new_world: int, stop_after: int, more: int
) -> None:
    """A job restarted on fewer (or more) ranks trains on the same samples, step by step."""
    num_samples, global_batch = 100, 10  # no short final step: epochs of 10 steps at any size
    more = min(more, 10 - stop_after)  # within the epoch (each iterator runs one epoch)

    def plan(world: int) -> tuple[int, ...]:
        base = [global_batch // world] * world
        base[0] += global_batch - sum(base)
        return tuple(base)

    ref = [UnevenBatchSampler(num_samples, plan(old_world), r, seed=5) for r in range(old_world)]
    iters = [iter(s) for s in ref]
    for _ in range(stop_after):
        for it in iters:
            next(it)
    state = ref[0].state_dict()
    expected = [sorted(i for it in iters for i in next(it)) for _ in range(more)]
    resumed = [
        UnevenBatchSampler(num_samples, plan(new_world), r, seed=5) for r in range(new_world)
    ]
    for s in resumed:
        s.load_state_dict(state, plans=False)
    new_iters = [iter(s) for s in resumed]
    got = [sorted(i for it in new_iters for i in next(it)) for _ in range(more)]
    assert got == expected
    assert [len(x) for x in got] == [global_batch] * more


@st.composite
def planner_plans(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, tuple[int, ...]]]]:
    """Plans as the balancer makes them: equal-time solves of random step models,
    rounded onto a grid of sizes (one rank takes ``B mod g``) within random bounds."""
    world = draw(st.integers(2, 5))
    global_batch = draw(st.integers(4 * world, 96))
    num_samples = draw(st.integers(global_batch, 300))
    constraints = Constraints(global_batch, world)
    changes = []
    for _ in range(draw(st.integers(1, 6))):
        models = [
            StepModel(draw(st.floats(1e-4, 1e-2)), draw(st.floats(0.0, 0.02))) for _ in range(world)
        ]
        grid = draw(st.sampled_from([1, 2, 4, 8]))
        plan = equal_time_plan(models, constraints, Box.of(constraints), grid)
        changes.append((draw(st.integers(0, 30)), plan))
    changes.sort(key=lambda c: c[0])
    return num_samples, world, changes


@settings(max_examples=100, deadline=None)
@given(planner_plans())
def test_every_sample_once_per_epoch_under_the_planners_grid_plans(scenario) -> None:
    num_samples, world, changes = scenario
    plan0 = changes[0][1]
    samplers = [UnevenBatchSampler(num_samples, plan0, r, seed=3) for r in range(world)]
    steps = _run_epoch(samplers, changes[1:])
    seen = [i for batch in steps for rank_idx in batch for i in rank_idx]
    assert len(seen) == len(set(seen)), "a sample was duplicated"
    expected = num_samples - samplers[0].dropped_per_epoch
    assert seen == epoch_permutation(num_samples, 3, 0)[:expected]
