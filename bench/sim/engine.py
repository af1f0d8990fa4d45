"""Run one policy on one simulated cluster, feeding it history exactly as the trainer does.

Each step every rank draws a noisy compute time for its batch; the step's wall
time is the slowest rank's compute plus the all-reduce cost (``comm_s``). At
the end of every ``rebalance_every`` steps each rank's ``RankInterval`` holds
its batch, the steps, the mean compute-only seconds per step (``compute_s``)
and the mean wall seconds per step (``step_s``); the interval is appended to
the history, the straggler detector reads it, and the policy's plan applies
from the next step. ``Constraints.comm_s`` is re-estimated from the history
(``estimate_comm_s``) the way a caller without a configured value would.

Alongside, the engine records the noise-free yardsticks per interval (see
``metrics.py`` for how they become the reported numbers): the plan's step
time, the ideal step time, and the oracle plan's step time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hetero.bench.sim.cluster import SimWorker, best_plan, constraints_for, make_workers
from hetero.bench.sim.scenario import Scenario
from hetero.core.balancer import (
    Batches,
    Policy,
    RankInterval,
    StragglerDetector,
    estimate_comm_s,
)
from hetero.core.balancer.straggler import per_sample_ratios
from hetero.core.errors import PlanError


@dataclass(frozen=True)
class IntervalRecord:
    """What happened in one rebalance interval. Times are seconds summed over its steps.

    ``plan_s``: noise-free step time of the plan in use (slowest rank + comm).
    ``ideal_s``: ``steps·B`` over the ideal throughput ``Σ b_i/(t_i(b_i)+comm)``.
    ``best_s``: noise-free step time of the oracle plan (best integer plan for
    the workers' true state at the interval's middle step).
    ``wall_s``: the simulated, noisy wall time.
    ``true_ratios``: each rank's noise-free per-sample time over the other
    ranks' median; ``flagged``: ranks the detector flagged after this interval.
    """

    index: int
    start_step: int
    steps: int
    batches: Batches
    plan_s: float
    ideal_s: float
    best_s: float
    wall_s: float
    true_ratios: tuple[float | None, ...]
    flagged: tuple[int, ...]
    changed: bool
    reason: str

    @property
    def pct_of_ideal(self) -> float:
        return 100.0 * self.ideal_s / self.plan_s

    @property
    def pct_of_best(self) -> float:
        return 100.0 * self.best_s / self.plan_s


@dataclass(frozen=True)
class SimRun:
    """Every interval of one policy on one scenario, oldest first."""

    scenario: Scenario
    policy: str
    detector: StragglerDetector
    intervals: tuple[IntervalRecord, ...]


def simulate(
    scenario: Scenario, policy: Policy, *, detector: StragglerDetector | None = None
) -> SimRun:
    """Run ``policy`` on ``scenario`` for all its steps; deterministic for a given seed."""
    detector = detector or StragglerDetector()
    workers = make_workers(scenario)
    profiles = [w.profile() for w in workers]
    base = constraints_for(scenario)
    constraints = base
    plan = policy.initial(constraints, profiles)
    constraints.check(plan)
    history: list[tuple[RankInterval, ...]] = []
    records: list[IntervalRecord] = []
    step = 0
    while step < scenario.steps:
        n = min(scenario.rebalance_every, scenario.steps - step)
        interval = _run_interval(scenario, workers, plan, step, n)
        history.append(interval.measured)
        flagged = tuple(e.rank for e in detector.detect(history))
        constraints = replace(base, comm_s=estimate_comm_s(history))
        decision = policy.next_plan(history, plan, constraints, profiles)
        try:
            constraints.check(decision.batches)
        except PlanError as exc:
            raise PlanError(f"policy {policy.name} returned an invalid plan: {exc}") from exc
        records.append(
            IntervalRecord(
                index=len(records),
                start_step=step,
                steps=n,
                batches=plan,
                plan_s=interval.plan_s,
                ideal_s=interval.ideal_s,
                best_s=interval.best_s,
                wall_s=interval.wall_s,
                true_ratios=interval.true_ratios,
                flagged=flagged,
                changed=decision.changed,
                reason=decision.reason,
            )
        )
        plan = decision.batches
        step += n
    return SimRun(scenario, policy.name, detector, tuple(records))


@dataclass(frozen=True)
class _Interval:
    measured: tuple[RankInterval, ...]
    plan_s: float
    ideal_s: float
    best_s: float
    wall_s: float
    true_ratios: tuple[float | None, ...]


def _run_interval(
    scenario: Scenario,
    workers: list[SimWorker],
    plan: Batches,
    start: int,
    steps: int,
) -> _Interval:
    comm = scenario.comm_s
    total_b = scenario.global_batch
    world = len(workers)
    compute = [0.0] * world
    expected = [0.0] * world
    wall = plan_s = ideal_s = best_s = 0.0
    oracle = best_plan(workers, start + steps // 2, constraints_for(scenario))
    for s in range(start, start + steps):
        noisy = [w.sample_s(s, b) for w, b in zip(workers, plan, strict=True)]
        exact = [w.expected_s(s, b) for w, b in zip(workers, plan, strict=True)]
        for r in range(world):
            compute[r] += noisy[r]
            expected[r] += exact[r]
        wall += max(noisy) + comm
        plan_s += max(exact) + comm
        ideal_s += total_b / sum(b / (t + comm) for b, t in zip(plan, exact, strict=True))
        best_s += max(w.expected_s(s, b) for w, b in zip(workers, oracle, strict=True)) + comm
    measured = tuple(
        RankInterval(r, plan[r], steps, compute[r] / steps, wall / steps) for r in range(world)
    )
    truth = tuple(RankInterval(r, plan[r], steps, expected[r] / steps) for r in range(world))
    return _Interval(measured, plan_s, ideal_s, best_s, wall, tuple(per_sample_ratios(truth)))
