"""The planner after a sudden change of one rank's speed, on the simulator.

``h100-neighbour-dynamic`` is ``gpu-neighbour-dynamic`` as measured on 2x NVIDIA
H100: a matmul neighbour on GPU 1 adds mostly a fixed cost per step (the GPU
at 256 samples goes from 65 to 115 ms), so one interval at the new speed
cannot tell the planner how far to move. On the GPUs the first plan after the
neighbour left was 364/148 -> 170/342 (256/256 was right): the neighbour's
fixed cost, carried into the freed GPU's fit, made it look nearly free per
sample. ``h100-neighbour-rerun`` is the re-run of 2026-11-27 on the same
hardware, calibrated from its intervals: the neighbour scales mostly the
per-sample cost, its effect begins half-way through the interval of steps
100-109 and ends when its queued work drains, near step 220; the rules before
the re-check reproduce that run's moves (316/196 -> 346/166 -> 362/150 on the
GPUs). Every run here is seeded and bit-for-bit reproducible.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from hetero.bench.harness.figures import adaptation_intervals, phases
from hetero.bench.sim import SimRun, load_scenario
from hetero.bench.sim import simulate as run_sim
from hetero.bench.sim.metrics import plan_within
from hetero.core.balancer import make_policy
from hetero.trainer.commsched import AutoComm
from hetero.trainer.gradients import OVERLAP

SCENARIO = "h100-neighbour-dynamic"
ARRIVES, LEAVES = 100, 200
SEEDS = range(20)


RERUN = "h100-neighbour-rerun"


@cache
def simulated(
    scenario: str, seed: int | None = None, interval_noise: float = 0.0, recheck: int = 3
) -> SimRun:
    sc = load_scenario(scenario)
    if seed is not None:
        sc = dataclasses.replace(sc, seed=seed, interval_noise_cv=interval_noise)
    return run_sim(sc, make_policy("dynamic", recheck_steps=recheck))


def adaptations(run: SimRun) -> list[int | None]:
    """Per change, as hetero-bench counts it on GPUs: intervals from the one containing
    the change until the throughput, warm-up of every move included, holds within 5% of
    the new phase's steady value for two intervals in a row."""
    steps = [r.start_step + r.steps for r in run.intervals]
    rates = [r.steps * run.scenario.global_batch / r.plan_s for r in run.intervals]
    changes = [(c, "change") for c in run.scenario.change_steps]
    return [adaptation_intervals(rates, p) for p in phases(steps, changes)[1:]]


def _first_plan_after(run: SimRun, step: int) -> tuple[int, ...]:
    containing = next(r.index for r in run.intervals if r.start_step + r.steps > step)
    return run.intervals[containing + 1].batches


def test_the_freed_gpu_does_not_take_more_than_an_equal_share_on_the_first_move() -> None:
    run = simulated(SCENARIO)
    before = _first_plan_after(run, LEAVES - 10)
    after = _first_plan_after(run, LEAVES)
    assert before[1] < 200  # the neighbour's phase had moved samples off GPU 1
    assert after[1] <= 256 + 8, [r.batches for r in run.intervals]


def test_the_plan_is_within_5_percent_two_intervals_after_either_change_at_low_noise() -> None:
    for seed in range(5):
        run = simulated(SCENARIO, seed)
        for change in (ARRIVES, LEAVES):
            n = plan_within(run, change)
            assert n is not None and n <= 2, (seed, change, [r.batches for r in run.intervals])


def test_the_throughput_is_back_one_interval_after_the_neighbour_leaves() -> None:
    # As hetero-bench counts it on GPUs: warm-up of every move included, within 5% of the
    # phase's steady value for two intervals in a row. One move to a size the GPUs ran
    # before (256) is the least a change can cost.
    run = simulated(SCENARIO)
    steps = [r.start_step + r.steps for r in run.intervals]
    rates = [r.steps * 512 / r.plan_s for r in run.intervals]
    left = phases(steps, [(ARRIVES, "arrives"), (LEAVES, "leaves")])[2]
    assert adaptation_intervals(rates, left) == 1


def test_at_3_percent_interval_noise_the_plan_finds_the_new_optimum_within_two_intervals() -> None:
    # Two levels of the changed GPU's new regime measure its fixed cost; before they did,
    # each move after the arrival closed part of the gap (330 -> 338 -> 354 -> 370).
    arrivals = [plan_within(simulated(SCENARIO, s, 0.03), ARRIVES) for s in SEEDS]
    departures = [plan_within(simulated(SCENARIO, s, 0.03), LEAVES) for s in SEEDS]
    assert sum(n is not None and n <= 2 for n in arrivals) >= 12, arrivals
    # A move pays for its switch only with the gain it is sure of (moves.py), so at 3%
    # noise a plan may sit just short of the optimum before the departure; one seed of
    # twenty then takes its departure's jump as noise for an interval and its second
    # move waits for a gain beyond the noise (5 intervals). None goes unsettled.
    assert all(n is not None for n in departures), departures
    assert sum(n <= 2 for n in departures if n is not None) >= 19, departures


def test_plan_changes_in_the_settled_half_stay_within_one_in_five_at_10_percent_noise() -> None:
    for seed in range(10):
        run = simulated("cpu-noisy-3", seed, 0.10)
        recs = run.intervals
        half = range(len(recs) // 2, len(recs))
        changes = sum(recs[j].batches != recs[j - 1].batches for j in half)
        assert changes <= len(half) / 5, (seed, [r.batches for r in recs])


def test_the_noise_check_of_the_integration_tests_holds_for_twenty_seeds_at_15_percent() -> None:
    # tests/integration/test_plan_noise.py's statements on its simulated counterpart, with
    # the emulation's fixed costs (it slows the whole step) and a host noisier than the
    # scenario's: the first move rests on one interval and may tie or invert the 2x and
    # 3x ranks for a few intervals, never for long, and the settled half stays calm.
    base = load_scenario("cpu-noisy-3")
    workers = tuple(
        dataclasses.replace(w, fixed_s=0.02 * (k + 1)) for k, w in enumerate(base.workers)
    )
    for seed in range(20):
        sc = dataclasses.replace(
            base,
            seed=seed,
            steps=200,
            interval_noise_cv=0.15,
            shared_noise_cv=0.10,
            workers=workers,
        )
        recs = run_sim(sc, make_policy("dynamic")).intervals
        plans = [r.batches for r in recs]
        changed = [r.changed for r in recs]
        after = plans[changed.index(True) + 1 :]
        inverted = [p[1] > p[0] or p[2] > p[1] or p[2] > p[0] for p in after]
        assert sum(inverted) <= len(after) / 4, (seed, plans)
        assert all(p[0] > p[1] > p[2] for p in plans[-5:]), (seed, plans)
        assert sum(changed[len(changed) // 2 :]) <= 3, (seed, plans)


def test_comm_auto_leaves_the_planner_most_of_its_intervals_at_3_percent_noise() -> None:
    # The simulated times do not depend on the comm mode, so overlap never really wins:
    # before trials had to beat the noise and wait for a settled planner, 63% of the
    # intervals ran in overlap and never reached the planner (20 seeds).
    withheld = []
    for seed in range(10):
        sc = dataclasses.replace(load_scenario(SCENARIO), seed=seed, interval_noise_cv=0.03)
        run = run_sim(sc, make_policy("dynamic"), comm=AutoComm())
        withheld.append(sum(r.comm == OVERLAP for r in run.intervals) / len(run.intervals))
    assert sum(withheld) / len(withheld) <= 0.25, withheld


def test_throughput_is_within_5_percent_two_intervals_after_each_change() -> None:
    # The target for gpu-neighbour-dynamic, on both calibrations. The first move
    # after the arrival goes to sizes never run (its warm-up costs that interval more
    # than 5%), so the move that the first one's measurement sizes must land in the same
    # interval: the re-check, three settled steps into it.
    for scenario in (SCENARIO, RERUN):
        run = simulated(scenario)
        assert all(n is not None and n <= 2 for n in adaptations(run)), (
            scenario,
            adaptations(run),
            [(r.batches, r.rechecked) for r in run.intervals],
        )


def test_without_the_recheck_the_arrival_takes_a_third_interval() -> None:
    # The second move then waits for the boundary and pays its warm-up in the interval
    # after: 3 intervals on both calibrations (4 on the GPUs, whose straddling interval
    # also counted as a level of the new speed).
    for scenario in (SCENARIO, RERUN):
        assert adaptations(simulated(scenario, recheck=0))[0] == 3


def test_the_recheck_lands_within_2_percent_of_the_oracle_in_the_interval_of_the_first_move() -> (
    None
):
    run = simulated(RERUN)
    first = next(r for r in run.intervals if r.start_step > ARRIVES)
    assert first.batches != run.intervals[first.index - 1].batches  # the first move
    assert first.rechecked is not None
    after = run.intervals[first.index + 1]
    assert after.batches == first.rechecked and not after.switch_s
    assert after.best_s / after.plan_s >= 0.98, (first.batches, first.rechecked)


def test_at_1_percent_interval_noise_nine_seeds_in_ten_meet_the_target() -> None:
    for scenario in (SCENARIO, RERUN):
        met = [
            all(n is not None and n <= 2 for n in adaptations(simulated(scenario, s, 0.01)))
            for s in range(10)
        ]
        assert sum(met) >= 9, (scenario, met)
