"""Simulated workers: true (noise-free) step times, per-step noise, and the oracle plan.

Times are seconds of compute-only work per step (forward + backward until the
last gradient bucket is ready), as the trainer measures them. The all-reduce
cost is the scenario's ``comm_s`` and is added by the engine, not here. A
worker with an input pipeline (``Worker.input_per_sample_s``) also has the
seconds its pipeline needs for a batch (``input_s``); a step lasts the larger of
the two (``step_s``).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Sequence

from hetero.bench.sim.scenario import Scenario, Worker
from hetero.core.balancer import Batches, Constraints, DeviceProfile


class SimWorker:
    """One worker's time model over the run; owns its seeded noise stream.

    Noise draws depend only on (scenario seed, rank, step), never on the
    policy, so every policy sees the same noise sequence per worker.
    """

    def __init__(self, worker: Worker, rank: int, seed: int, default_cv: float) -> None:
        self.worker = worker
        self.rank = rank
        self._rng = random.Random(f"hetero-sim:{seed}:{rank}")
        self._interval_rng = random.Random(f"hetero-sim-interval:{seed}:{rank}")
        self._input_rng = random.Random(f"hetero-sim-input:{seed}:{rank}")
        self._default_cv = default_cv if worker.noise_cv is None else worker.noise_cv
        self._change_steps = [c.at_step for c in worker.changes]
        self._curve_b = [p.batch for p in worker.curve]
        self._curve_t = [p.step_s for p in worker.curve]
        self._curve_cv = [p.cv for p in worker.curve]

    def factors(self, step: int) -> tuple[float, float]:
        """(per-sample, fixed) multipliers at ``step`` from drift and sudden changes."""
        per_sample = fixed = 1.0
        k = bisect.bisect_right(self._change_steps, step)
        if k:
            change = self.worker.changes[k - 1]
            per_sample, fixed = change.per_sample_factor, change.fixed_factor
        drift = self.worker.drift
        if drift is not None:
            d = 1.0 + (drift.factor - 1.0) * (1.0 - math.exp(-step / drift.tau_steps))
            per_sample *= d
            fixed *= d
        return per_sample, fixed

    def expected_s(self, step: int, batch: int) -> float:
        """Noise-free compute seconds for one step of ``batch`` samples at ``step``."""
        per_sample, fixed = self.factors(step)
        w = self.worker
        if w.curve:
            # A measured curve has no per-sample/fixed split: a change scales all of it.
            return max(_interpolate(self._curve_b, self._curve_t, batch), 1e-9) * per_sample
        seconds: float = w.per_sample_s * per_sample * batch + w.fixed_s * fixed
        return seconds

    def expected_step_s(self, step: int, batch: int) -> float:
        """Noise-free seconds of one step: compute, or the input pipeline where slower."""
        return max(self.expected_s(step, batch), self.worker.input_per_sample_s * batch)

    def input_s(self, batch: int) -> float | None:
        """One batch's noisy input seconds (None without a pipeline): mean-1 log-normal
        jitter on ``input_per_sample_s · batch``, from the worker's own stream."""
        w = self.worker
        if w.input_per_sample_s <= 0:
            return None
        return w.input_per_sample_s * batch * lognormal_factor(self._input_rng, w.input_jitter_cv)

    def cv(self, batch: int) -> float:
        """Coefficient of variation of one step's time at ``batch``."""
        if self.worker.curve and self.worker.noise_cv is None:
            return max(_interpolate(self._curve_b, self._curve_cv, batch), 0.0)
        return self._default_cv

    def interval_factor(self, cv: float) -> float:
        """This worker's mean-1 log-normal factor for one interval (its own stream)."""
        return lognormal_factor(self._interval_rng, cv)

    def sample_s(self, step: int, batch: int) -> float:
        """One noisy step time: the expected time times a mean-1 log-normal factor."""
        expected = self.expected_s(step, batch)
        cv = self.cv(batch)
        if cv <= 0:
            return expected
        sigma = math.sqrt(math.log1p(cv * cv))
        return expected * self._rng.lognormvariate(-0.5 * sigma * sigma, sigma)

    def profile(self) -> DeviceProfile:
        """What the hardware profile would report: the static compute score."""
        w = self.worker
        if w.compute_score is not None:
            score = w.compute_score
        elif w.curve:
            first, last = w.curve[0], w.curve[-1]
            score = (last.batch - first.batch) / (last.step_s - first.step_s)
        else:
            score = 1.0 / w.per_sample_s
        return DeviceProfile(w.name, score)


def lognormal_factor(rng: random.Random, cv: float) -> float:
    """A mean-1 log-normal factor with coefficient of variation ``cv`` (1.0 for cv 0)."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return rng.lognormvariate(-0.5 * sigma * sigma, sigma)


def make_workers(scenario: Scenario) -> list[SimWorker]:
    return [
        SimWorker(w, rank, scenario.seed, scenario.noise_cv)
        for rank, w in enumerate(scenario.workers)
    ]


def constraints_for(scenario: Scenario, comm_s: float = 0.0) -> Constraints:
    caps = tuple(w.max_batch for w in scenario.workers)
    return Constraints(
        scenario.global_batch,
        len(scenario.workers),
        scenario.min_batch,
        caps if any(c is not None for c in caps) else None,
        comm_s,
    )


def best_plan(workers: Sequence[SimWorker], step: int, constraints: Constraints) -> Batches:
    """The integer plan with the smallest noise-free step time at ``step`` (the oracle).

    Greedy water-filling: start every rank at ``min_batch`` and give each
    further sample to the rank whose time after taking it is smallest. For
    times that grow with the batch this minimises the slowest rank's time.
    """
    plan = [constraints.min_batch] * len(workers)
    heap = [
        (w.expected_step_s(step, plan[r] + 1), r)
        for r, w in enumerate(workers)
        if plan[r] < constraints.upper(r)
    ]
    heapq.heapify(heap)
    for _ in range(constraints.global_batch - sum(plan)):
        _, r = heapq.heappop(heap)
        plan[r] += 1
        if plan[r] < constraints.upper(r):
            heapq.heappush(heap, (workers[r].expected_step_s(step, plan[r] + 1), r))
    return tuple(plan)


def _interpolate(batches: Sequence[int], values: Sequence[float], batch: int) -> float:
    """Piecewise-linear in batch through the points, extended linearly past the ends."""
    k = min(max(bisect.bisect_left(batches, batch), 1), len(batches) - 1)
    b0, b1 = batches[k - 1], batches[k]
    v0, v1 = values[k - 1], values[k]
    return v0 + (v1 - v0) * (batch - b0) / (b1 - b0)
