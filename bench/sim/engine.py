"""Run one policy on one simulated cluster, feeding it history exactly as the trainer does.

Each step every rank draws a noisy busy time for its batch; the step's wall
time is the slowest rank's busy time plus the all-reduce cost (``comm_s``). At
the end of every ``rebalance_every`` steps each rank's ``RankInterval`` holds
its batch, the steps, the median busy seconds per step (``compute_s``, as the
trainer takes it: an interval a change of speed cuts in two reports the
speed of its larger part; the simulated workers have no separate input or
optimizer phase), the mean wall
seconds per step (``step_s``) and, for a rank whose batch just changed, what
the change cost it (``switch_s``: the worker's cost of a new or of a warm
size, paid once in the interval's first step, as the trainer measures it);
the interval is appended to the history, the straggler detector reads it, and
the policy's plan applies from the next step, with the steps left in the run
as the policy's horizon. A decision that asks for a re-check
(``Decision.recheck_steps``) is answered as the trainer does: the next
interval's first that many steps are measured as an interval of their own,
the policy is asked again, and the rest of the interval runs on its answer (a
second switch paid if it moved; the re-check's interval leaves the history
again if it did not, so no steps count twice). A scenario may add interval-level noise, a shared
host's load: per interval, each rank's times scaled by its own factor and all
ranks' by one shared factor (noise, not a change of speed: the noise-free
yardsticks leave it out). ``Constraints.comm_s`` is re-estimated from the
history (``estimate_comm_s``) the way a caller without a configured value
would.

With ``comm`` (``hetero.trainer.commsched.AutoComm`` or anything with its
``next_mode``), the engine chooses each interval's comm mode as rank 0 does
under ``comm="auto"`` and, as the trainer does, leaves the intervals run in
overlap out of the policy's history. The simulated workers' times do not
depend on the mode: what this shows is what trials of overlap cost the
planner in evidence.

Alongside, the engine records the noise-free yardsticks per interval (see
``metrics.py`` for how they become the reported numbers): the plan's step
time, the ideal step time, and the oracle plan's step time.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace
from typing import Protocol

from hetero.bench.sim.cluster import (
    SimWorker,
    best_plan,
    constraints_for,
    lognormal_factor,
    make_workers,
)
from hetero.bench.sim.scenario import Scenario
from hetero.core.balancer import (
    Batches,
    Constraints,
    Decision,
    Horizon,
    Policy,
    RankInterval,
    StragglerDetector,
    estimate_comm_s,
)
from hetero.core.balancer.straggler import per_sample_ratios
from hetero.core.errors import PlanError

#: The comm mode whose intervals the trainer leaves out of the planner's history
#: (``hetero.trainer.gradients.OVERLAP``; not imported: the simulator runs without torch).
OVERLAP = "overlap"


class CommChooser(Protocol):
    """Rank 0's choice of the next interval's comm mode (``trainer.commsched.CommPolicy``)."""

    def next_mode(
        self,
        batches: tuple[int, ...] | None,
        step_s: float | None,
        plan_changed: bool,
        *,
        settled: bool = True,
    ) -> tuple[str, str]: ...


@dataclass(frozen=True)
class IntervalRecord:
    """What happened in one rebalance interval. Times are seconds summed over its steps.

    ``plan_s``: noise-free step time of the plan in use (slowest rank + comm), plus
    ``switch_s``, the warm-up the job waited for at a plan change (the largest
    of the switching ranks' costs).
    ``ideal_s``: ``steps·B`` over the ideal throughput ``Σ b_i/(t_i(b_i)+comm)``.
    ``best_s``: noise-free step time of the oracle plan (best integer plan for
    the workers' true state at the interval's middle step).
    ``wall_s``: the simulated, noisy wall time.
    ``true_ratios``: each rank's noise-free per-sample time over the other
    ranks' median; ``flagged``: ranks the detector flagged after this interval.
    ``ordered``: no rank that is truly slower (by more than ``ORDER_MARGIN`` at
    the mean batch) holds as many samples as a faster one (of the plan the
    interval ended on). ``batches`` is the plan the interval started with;
    ``rechecked``, the plan a re-check within the interval moved to (None if
    none did).
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
    switch_s: float = 0.0
    ordered: bool = True
    comm: str = ""
    rechecked: Batches | None = None

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
    scenario: Scenario,
    policy: Policy,
    *,
    detector: StragglerDetector | None = None,
    comm: CommChooser | None = None,
) -> SimRun:
    """Run ``policy`` on ``scenario`` for all its steps; deterministic for a given seed.
    ``comm``: choose comm modes as under ``comm="auto"`` (module doc)."""
    detector = detector or StragglerDetector()
    workers = make_workers(scenario)
    profiles = [w.profile() for w in workers]
    base = constraints_for(scenario)
    constraints = base
    plan = policy.initial(constraints, profiles)
    constraints.check(plan)
    history: list[tuple[RankInterval, ...]] = []
    records: list[IntervalRecord] = []
    ran: list[set[int]] = [{b} for b in plan]
    before = plan
    shared = random.Random(f"hetero-sim-shared:{scenario.seed}")
    step = 0
    mode = ""
    recheck = 0
    while step < scenario.steps:
        n = min(scenario.rebalance_every, scenario.steps - step)
        load = lognormal_factor(shared, scenario.shared_noise_cv)
        factors = tuple(load * w.interval_factor(scenario.interval_noise_cv) for w in workers)
        switches = _switches(workers, before, plan, ran)
        started = plan
        if 0 < recheck < n and mode != OVERLAP:
            # The policy asked to see its move within the interval: measure the first
            # steps, ask again, and run the rest of the interval on its answer.
            head = _run_interval(scenario, workers, plan, step, recheck, switches, factors)
            history.append(head.measured)
            constraints = replace(base, comm_s=estimate_comm_s(history))
            horizon = Horizon(scenario.rebalance_every, scenario.steps - step - recheck)
            second = policy.next_plan(history, plan, constraints, profiles, horizon)
            _check(policy, constraints, second)
            for r, b in enumerate(plan):
                ran[r].add(b)
            if second.changed and second.batches != plan:
                plan = second.batches
                switches = _switches(workers, started, plan, ran)
            else:
                history.pop()  # the rest of the interval measures the same plan
                switches = (None,) * len(workers)
            tail = _run_interval(
                scenario, workers, plan, step + recheck, n - recheck, switches, factors
            )
            interval = _joined(head, tail)
        else:
            interval = _run_interval(scenario, workers, plan, step, n, switches, factors)
        if mode != OVERLAP:
            history.append(interval.measured)
        flagged = tuple(e.rank for e in detector.detect(history))
        constraints = replace(base, comm_s=estimate_comm_s(history))
        horizon = Horizon(scenario.rebalance_every, scenario.steps - step - n)
        decision = policy.next_plan(history, plan, constraints, profiles, horizon)
        _check(policy, constraints, decision)
        records.append(
            IntervalRecord(
                index=len(records),
                start_step=step,
                steps=n,
                batches=started,
                plan_s=interval.plan_s,
                ideal_s=interval.ideal_s,
                best_s=interval.best_s,
                wall_s=interval.wall_s,
                true_ratios=interval.true_ratios,
                flagged=flagged,
                changed=decision.changed,
                reason=decision.reason,
                switch_s=interval.switch_s,
                ordered=interval.ordered,
                comm=mode,
                rechecked=plan if plan != started else None,
            )
        )
        if comm is not None:
            wall = max(ri.step_s for ri in interval.measured)
            mode, _ = comm.next_mode(plan, wall, decision.changed, settled=decision.settled)
        for r, b in enumerate(plan):
            ran[r].add(b)
        moved = decision.changed and decision.batches != plan
        recheck = decision.recheck_steps if moved else 0
        before, plan = plan, decision.batches
        step += n
    return SimRun(scenario, policy.name, detector, tuple(records))


def _check(policy: Policy, constraints: Constraints, decision: Decision) -> None:
    try:
        constraints.check(decision.batches)
    except PlanError as exc:
        raise PlanError(f"policy {policy.name} returned an invalid plan: {exc}") from exc


def _joined(head: _Interval, tail: _Interval) -> _Interval:
    """One interval from its two parts around a re-check: the yardsticks summed, the
    measurements the tail's (the plan the interval ended on)."""
    return _Interval(
        tail.measured,
        head.plan_s + tail.plan_s,
        head.ideal_s + tail.ideal_s,
        head.best_s + tail.best_s,
        head.wall_s + tail.wall_s,
        tail.true_ratios,
        head.switch_s + tail.switch_s,
        tail.ordered,
    )


def _switches(
    workers: list[SimWorker], before: Batches, plan: Batches, ran: list[set[int]]
) -> tuple[float | None, ...]:
    """Each rank's switching cost entering ``plan`` from ``before``; None if unchanged."""
    out: list[float | None] = []
    for w, old, new, sizes in zip(workers, before, plan, ran, strict=True):
        if old == new:
            out.append(None)
        else:
            out.append(w.worker.warm_switch_s if new in sizes else w.worker.switch_s)
    return tuple(out)


@dataclass(frozen=True)
class _Interval:
    measured: tuple[RankInterval, ...]
    plan_s: float
    ideal_s: float
    best_s: float
    wall_s: float
    true_ratios: tuple[float | None, ...]
    switch_s: float
    ordered: bool


#: Relative difference in true speed beyond which a plan must order two ranks.
ORDER_MARGIN = 0.10


def _ordered(workers: list[SimWorker], plan: Batches, step: int, mean_batch: int) -> bool:
    """Whether ``plan`` gives every truly slower rank fewer samples than a faster one."""
    times = [w.expected_step_s(step, mean_batch) for w in workers]
    return all(
        plan[j] < plan[i]
        for i, ti in enumerate(times)
        for j, tj in enumerate(times)
        if tj > ti * (1.0 + ORDER_MARGIN)
    )


def _spread(values: list[float]) -> float | None:
    """Robust relative spread of one rank's step or input times (as the trainer reports them)."""
    if len(values) < 3:
        return None
    mid = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - mid) for v in values) / mid if mid > 0 else None


def _run_interval(
    scenario: Scenario,
    workers: list[SimWorker],
    plan: Batches,
    start: int,
    steps: int,
    switches: tuple[float | None, ...],
    factors: tuple[float, ...],
) -> _Interval:
    comm = scenario.comm_s
    total_b = scenario.global_batch
    world = len(workers)
    compute = [0.0] * world
    samples: list[list[float]] = [[] for _ in range(world)]
    waits: list[list[float]] = [[] for _ in range(world)]
    inputs: list[list[float]] = [[] for _ in range(world)]
    expected = [0.0] * world
    wall = plan_s = ideal_s = best_s = 0.0
    walls: list[float] = []
    oracle = best_plan(workers, start + steps // 2, constraints_for(scenario))
    for s in range(start, start + steps):
        noisy = [w.sample_s(s, b) * f for w, b, f in zip(workers, plan, factors, strict=True)]
        exact = [w.expected_step_s(s, b) for w, b in zip(workers, plan, strict=True)]
        busy = list(noisy)
        for r, (w, b) in enumerate(zip(workers, plan, strict=True)):
            made = w.input_s(b)
            if made is not None:
                # A batch its pipeline made more slowly than the rank computed is waited
                # for (no prefetch depth to absorb it: jitter shows in full).
                inputs[r].append(made)
                waits[r].append(max(made - noisy[r], 0.0))
                busy[r] = max(noisy[r], made)
        for r in range(world):
            compute[r] += noisy[r]
            samples[r].append(noisy[r])
            expected[r] += exact[r]
        walls.append(max(busy) + comm)
        wall += walls[-1]
        plan_s += max(exact) + comm
        ideal_s += total_b / sum(b / (t + comm) for b, t in zip(plan, exact, strict=True))
        best_s += max(w.expected_step_s(s, b) for w, b in zip(workers, oracle, strict=True)) + comm
    # The warm-up is paid once, in the first step, and left out of the rank's
    # per-step times, its step time included (the trainer's settle_steps: medians of
    # the settled steps); the job waits for the slowest.
    warmup = max((s for s in switches if s is not None), default=0.0)
    wall += warmup
    plan_s += warmup
    measured = tuple(
        RankInterval(
            r,
            plan[r],
            steps,
            statistics.median(samples[r]),
            statistics.median(walls),
            data_s=statistics.fmean(waits[r]) if waits[r] else None,
            switch_s=switches[r],
            busy_cv=_spread(samples[r]),
            input_s=statistics.median(inputs[r]) if inputs[r] else None,
            input_cv=_spread(inputs[r]),
        )
        for r in range(world)
    )
    truth = tuple(RankInterval(r, plan[r], steps, expected[r] / steps) for r in range(world))
    ratios = tuple(per_sample_ratios(truth))
    ordered = _ordered(workers, plan, start + steps // 2, total_b // world)
    return _Interval(measured, plan_s, ideal_s, best_s, wall, ratios, warmup, ordered)
