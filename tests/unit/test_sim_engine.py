"""The simulator feeds policies exactly what the trainer would, and measures honestly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from hetero.bench.sim import parse_scenario, simulate, summarize
from hetero.bench.sim.cluster import best_plan, constraints_for, make_workers
from hetero.core.balancer import (
    Batches,
    Constraints,
    Decision,
    DeviceProfile,
    History,
    Horizon,
    equal_batches,
)

NOISE_FREE = """
global_batch: 300
steps: 60
rebalance_every: 20
comm_s: 0.01
workers:
  - {name: fast, per_sample_s: 0.001, fixed_s: 0.02}
  - {name: slow, per_sample_s: 0.002, fixed_s: 0.01, compute_score: 7.0}
"""


@dataclass
class Recorder:
    """A policy that keeps the equal plan and records what it was given."""

    name: str = "recorder"
    seen: list[tuple[History, Constraints]] = field(default_factory=list)

    def initial(
        self, constraints: Constraints, profiles: Sequence[DeviceProfile] | None = None
    ) -> Batches:
        return equal_batches(constraints)

    def next_plan(
        self,
        history: History,
        current: Batches,
        constraints: Constraints,
        profiles: Sequence[DeviceProfile] | None = None,
        horizon: Horizon | None = None,
    ) -> Decision:
        self.seen.append((list(history), constraints))
        return Decision(current, False, "recording")


def test_policy_sees_mean_compute_seconds_per_step_and_wall_step_time_per_interval() -> None:
    recorder = Recorder()
    simulate(parse_scenario("noise-free", NOISE_FREE), recorder)
    history, constraints = recorder.seen[-1]
    assert len(history) == 3
    fast, slow = history[-1]
    assert (fast.rank, fast.batch, fast.steps) == (0, 150, 20)
    assert fast.compute_s == pytest.approx(0.001 * 150 + 0.02)
    assert slow.compute_s == pytest.approx(0.002 * 150 + 0.01)
    assert fast.step_s == slow.step_s == pytest.approx(slow.compute_s + 0.01)
    assert constraints.comm_s == pytest.approx(0.01)  # estimated from the history


def test_a_balanced_noise_free_plan_scores_100_percent_of_ideal_despite_comm() -> None:
    text = NOISE_FREE.replace("fixed_s: 0.01, compute_score: 7.0", "fixed_s: 0.02")
    text = text.replace("per_sample_s: 0.002", "per_sample_s: 0.001")
    r = summarize(simulate(parse_scenario("balanced", text), Recorder()))
    assert r.pct_of_ideal == pytest.approx(100.0)
    assert r.pct_of_best == pytest.approx(100.0)


def test_oracle_plan_minimises_the_slowest_rank_under_caps() -> None:
    scenario = parse_scenario(
        "capped",
        NOISE_FREE.replace("compute_score: 7.0", "compute_score: 7.0, max_batch: 60"),
    )
    workers = make_workers(scenario)
    plan = best_plan(workers, 0, constraints_for(scenario))
    assert plan == (240, 60)


def test_profiles_come_from_compute_scores_or_per_sample_speed() -> None:
    workers = make_workers(parse_scenario("noise-free", NOISE_FREE))
    assert workers[0].profile().compute_score == pytest.approx(1000.0)
    assert workers[1].profile().compute_score == 7.0


def test_a_curve_worker_interpolates_its_measured_points() -> None:
    scenario = parse_scenario(
        "curve",
        """
        global_batch: 64
        steps: 20
        rebalance_every: 20
        workers:
          - name: measured
            curve: [{batch: 32, step_s: 0.02, cv: 0.1}, {batch: 64, step_s: 0.03}]
          - {name: model, per_sample_s: 0.001}
        """,
    )
    worker = make_workers(scenario)[0]
    assert worker.expected_s(0, 48) == pytest.approx(0.025)
    assert worker.cv(48) == pytest.approx(0.05)
    assert worker.expected_s(0, 96) == pytest.approx(0.04)  # extended past the last point
