"""The balancer-quality targets, measured on the deterministic simulator.

These are correctness statements about a seeded, noise-controlled simulation
(not speed measurements): each run is bit-for-bit reproducible.
"""

from __future__ import annotations

from functools import cache

import pytest

from hetero.bench.sim import (
    SimResult,
    SimRun,
    known_scenarios,
    load_scenario,
    parse_scenario,
    summarize,
)
from hetero.bench.sim import simulate as run_sim
from hetero.core.balancer import make_policy

#: The memory cap pins a rank below its share, so it idles every step: no plan
#: reaches the ideal there, and the target is to match the best possible plan.
IDEAL_UNREACHABLE = {"memory-capped"}
#: Interval-level noise of 10-30% (a loaded CPU host): the targets there are order and calm.
NOISY = {"cpu-loaded", "cpu-noisy-3"}


@cache
def simulated(scenario: str, policy: str) -> SimRun:
    return run_sim(load_scenario(scenario), make_policy(policy))


def result(scenario: str, policy: str) -> SimResult:
    return summarize(simulated(scenario, policy))


@pytest.mark.parametrize("scenario", sorted(set(known_scenarios()) - IDEAL_UNREACHABLE - NOISY))
def test_dynamic_reaches_97_percent_of_ideal_in_steady_state(scenario: str) -> None:
    assert result(scenario, "dynamic").pct_of_ideal >= 97.0


@pytest.mark.parametrize("scenario", sorted(IDEAL_UNREACHABLE))
def test_dynamic_matches_the_best_possible_plan_where_the_ideal_is_unreachable(
    scenario: str,
) -> None:
    r = result(scenario, "dynamic")
    assert r.pct_of_best >= 99.5
    assert r.pct_of_ideal < 97.0  # else this scenario no longer needs its exception


@pytest.mark.parametrize("scenario", ["neighbour", "eight-workers"])
def test_dynamic_is_back_within_95_percent_of_the_new_ideal_two_intervals_after_a_change(
    scenario: str,
) -> None:
    r = result(scenario, "dynamic")
    assert r.reconverged
    assert r.reconverge_intervals is not None and r.reconverge_intervals <= 2


def test_equal_never_recovers_from_a_neighbour_that_stays() -> None:
    assert not result("eight-workers", "equal").reconverged


def test_dynamic_churns_at_most_two_percent_of_the_batch_per_interval_under_5pct_noise() -> None:
    assert result("noise-5pct", "dynamic").churn_pct <= 2.0


def test_a_worker_slowed_one_and_a_half_times_is_flagged_within_three_intervals() -> None:
    run = simulated("eight-workers", "dynamic")
    change = run.scenario.change_steps[0]
    slowed = 7
    containing = next(
        r.index for r in run.intervals if r.start_step <= change < r.start_step + r.steps
    )
    first_flag = next(r.index for r in run.intervals if slowed in r.flagged)
    assert first_flag - containing + 1 <= 3
    assert all(set(r.flagged) <= {slowed} for r in run.intervals)


def test_no_straggler_false_positive_in_a_thousand_intervals_of_5pct_noise() -> None:
    scenario = parse_scenario(
        "noise-1000",
        """
        global_batch: 1024
        steps: 10000
        rebalance_every: 10
        noise_cv: 0.05
        comm_s: 0.008
        seed: 21
        workers:
          - {name: a, count: 4, per_sample_s: 0.0003, fixed_s: 0.006}
          - {name: b, count: 4, per_sample_s: 0.00035, fixed_s: 0.006}
        """,
    )
    r = summarize(run_sim(scenario, make_policy("dynamic")))
    assert r.intervals == 1000
    assert r.false_positives == 0 and r.stragglers_flagged == 0


def test_proportional_to_throughput_is_wrong_when_fixed_costs_dominate() -> None:
    pct = {p: result("fixed-cost-heavy", p).pct_of_ideal for p in ("proportional", "dynamic")}
    assert pct["proportional"] < 80.0 < 99.0 < pct["dynamic"]


def test_the_simulation_is_deterministic_for_a_seed() -> None:
    first = simulated("noise-5pct", "dynamic")  # the targets' run (made here if alone)
    again = run_sim(load_scenario("noise-5pct"), make_policy("dynamic"))
    assert again.intervals == first.intervals
