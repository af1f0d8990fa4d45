"""Do no harm: a plan that does not beat ``equal`` in measured step time goes back to it.

The planner moves on fitted models, and a model can be wrong in ways its own
error bars do not show: an input pipeline that slows as its rank takes more
samples, an all-reduce that overlaps less, a neighbour whose share of a GPU
depends on the batch. What plain DDP would do is known better than any model:
``equal`` is the plan every measurement-driven policy starts from, so within a
speed regime (no rank's speed changed since, ``changepoint``) the job has
measured it. This module compares what was measured, step time per plan, and
nothing else:

- a plan that is not the equal plan, measured for at least ``MIN_INTERVALS``
  intervals of the regime, is reverted (``revert``) when its measured gain over
  the equal plan measured in the same regime is under ``dead_band`` and short of
  the gain its models predicted by more than ``z`` standard errors of the
  measured difference: what was predicted did not show. The standard error comes
  from how much the regime's step times spread about their plans' medians, so on
  a quiet GPU a missing 3% shows within two intervals, while on a loaded CPU box,
  whose intervals swing by 20%, two intervals cannot refute a predicted 20% and
  the move is kept until they can. The spread of an interval's own steps
  (``RankInterval.noise_floor``) bounds that noise from below, before the regime
  has intervals enough to measure it. A plan slower than the equal plan by more
  than ``CLEAR_LOSS`` and that error goes back after one interval;
- back at the equal plan, the planner holds it (``hold``) for as long as the
  regime lasts: the models that proposed the failed plan have seen nothing new,
  so they would propose it again. A change of any rank's speed starts a new
  regime, and the planner may try again; so may one whose failed try has left
  the history it is handed (a longer wait where a coordinator keeps fewer
  intervals than the trainer).

The step time of an interval is its slowest rank's median settled step
(``RankInterval.step_s``: input wait, compute, communication and optimizer, all
of it). Steps at a new batch size are not in it; what a switch costs is the
pay-back rule's (``payback``). Pure: intervals in, a verdict out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from hetero.core.balancer.decision import Decision
from hetero.core.balancer.model import StepModel, predict_step_s
from hetero.core.balancer.moves import MoveRules
from hetero.core.balancer.payback import gain_threshold
from hetero.core.balancer.plan import Batches, Constraints, equal_batches
from hetero.core.balancer.robust_fit import RankFit
from hetero.core.balancer.stats import Interval

#: Intervals a plan must be measured for before it is judged against the equal plan.
MIN_INTERVALS = 2
#: A plan measured this much slower per step than the equal plan goes back at once.
CLEAR_LOSS = 0.10
#: Relative noise of one interval's step time assumed until the regime measures it.
DEFAULT_NOISE = 0.05
#: The variance of a median over a mean's, for Gaussian noise (π/2).
MEDIAN_VARIANCE = math.pi / 2


@dataclass(frozen=True)
class Guard:
    """The verdict: ``keep`` (nothing measured says otherwise), ``revert`` (the current
    plan does not beat the equal plan) or ``hold`` (at the equal plan after a plan that
    did not beat it, in this regime). ``reason`` says what was measured."""

    action: Literal["keep", "revert", "hold"]
    reason: str = ""


def step_s(interval: Interval) -> float | None:
    """The interval's step time, seconds: its slowest rank's median settled step; None
    where a rank measured no step."""
    if not interval or any(ri.steps <= 0 or ri.step_s <= 0 for ri in interval):
        return None
    return max(ri.step_s for ri in interval)


def judge(
    regime: Sequence[Interval],
    current: Batches,
    equal: Batches,
    *,
    dead_band: float,
    z: float,
    predicted_gain: Callable[[Batches], float],
) -> Guard:
    """The verdict on ``current`` from the intervals of the current speed regime,
    oldest first (module doc); ``equal`` is the equal plan, ``predicted_gain(plan)``
    the relative gain over it that the models predict for ``plan``."""
    by_plan: dict[Batches, list[float]] = {}
    for iv in regime:
        t = step_s(iv)
        if t is not None:
            by_plan.setdefault(tuple(ri.batch for ri in iv), []).append(t)
    base = by_plan.get(tuple(equal))
    if not base:
        return Guard("keep")
    noise = max(_noise(by_plan), _floor(regime))

    def fails(plan: Batches) -> bool:
        times = by_plan.get(plan, [])
        if not times:
            return False
        gain = 1.0 - statistics.median(times) / statistics.median(base)
        se = noise * math.sqrt(MEDIAN_VARIANCE * (1.0 / len(base) + 1.0 / len(times)))
        if len(times) < MIN_INTERVALS:
            return gain < -max(CLEAR_LOSS, z * se)
        return gain < dead_band and predicted_gain(plan) - gain > z * se

    if tuple(current) != tuple(equal):
        if fails(tuple(current)):
            return Guard("revert", _compare(current, by_plan[tuple(current)], base))
        return Guard("keep")
    failed = [p for p in by_plan if p != tuple(equal) and fails(p)]
    if failed:
        return Guard("hold", _compare(failed[-1], by_plan[failed[-1]], base))
    return Guard("keep")


def _noise(by_plan: dict[Batches, list[float]]) -> float:
    """Relative noise of one interval's step time: the robust spread of the regime's
    intervals about their plans' medians (``DEFAULT_NOISE`` from fewer than three)."""
    deviations = [
        t / statistics.median(ts) - 1.0 for ts in by_plan.values() if len(ts) >= 2 for t in ts
    ]
    if len(deviations) < 3:
        return DEFAULT_NOISE
    mid = statistics.median(deviations)
    return max(1.4826 * statistics.median(abs(d - mid) for d in deviations), 1e-3)


def _floor(regime: Sequence[Interval]) -> float:
    """The noise of one interval's step time that its own steps measure: the median over
    the regime of each interval's largest ``RankInterval.noise_floor`` (how well its
    median is known from the spread of its steps); 0.0 where none reports one. Three
    steps of a rank that shares two cores with others spread by 20% and more: an
    interval of them cannot refute a move that its median misses by as much."""
    floors = sorted(
        max(fs) for iv in regime if (fs := [f for ri in iv if (f := ri.noise_floor) is not None])
    )
    return floors[len(floors) // 2] if floors else 0.0


def _compare(plan: Sequence[int], times: Sequence[float], base: Sequence[float]) -> str:
    mine, equal_s = statistics.median(times), statistics.median(base)
    return (
        f"plan {list(plan)} measured {mine * 1e3:.1f} ms/step over {len(times)} interval(s) "
        f"against {equal_s * 1e3:.1f} ms/step for equal batches"
    )


def why_not(
    models: Sequence[StepModel], equal: Batches, comm_s: float, *, alike_within: float
) -> str:
    """Why balancing cannot beat the equal plan under ``models``, in a user's words
    ("devices alike", "input-bound ...", "communication-bound ..."); "" where the
    models name no cause. ``alike_within``: the relative spread of the ranks' times
    at the equal plan under which they count as alike (the gain a move would need)."""
    times = [m.time(b) for m, b in zip(models, equal, strict=True)]
    works = [m.work(b) for m, b in zip(models, equal, strict=True)]
    slow = max(range(len(times)), key=lambda i: times[i])
    step = times[slow]
    causes = []
    if step > 0 and min(works) >= max(works) * (1.0 - alike_within):
        causes.append("devices alike")
    if models[slow].input_bound(equal[slow]):
        causes.append(
            f"input-bound (rank {slow}'s loader needs {step * 1e3:.1f} ms per batch, "
            f"it computes one in {works[slow] * 1e3:.1f} ms)"
        )
    if comm_s > step:
        causes.append(
            f"communication-bound ({comm_s * 1e3:.1f} ms/step of exposed communication "
            f"against {step * 1e3:.1f} ms of the slowest rank's work)"
        )
    return ", ".join(causes)


def guarded(
    decision: Decision,
    regime: Sequence[Interval],
    current: Batches,
    constraints: Constraints,
    models: Sequence[StepModel],
    fits: Sequence[RankFit],
    rules: MoveRules,
) -> Decision:
    """A measurement-driven policy's ``decision`` checked against what the equal plan
    measured in the current speed ``regime`` (``judge``), and, where the plan is or
    goes back to the equal plan, why balancing does not help (``why_not``, in
    ``Decision.not_helping``)."""
    equal = equal_batches(constraints)
    t_equal = predict_step_s(models, equal, comm_s=constraints.comm_s)

    def predicted_gain(plan: Batches) -> float:
        return 1.0 - predict_step_s(models, plan, comm_s=constraints.comm_s) / t_equal

    verdict = judge(
        regime,
        current,
        equal,
        dead_band=rules.dead_band,
        z=rules.confidence_z,
        predicted_gain=predicted_gain,
    )
    if verdict.action == "keep" and (decision.changed or current != equal):
        return decision
    threshold = gain_threshold(
        models, fits, equal, equal, z=rules.confidence_z, default_cv=rules.default_cv
    )
    why = why_not(models, equal, constraints.comm_s, alike_within=max(rules.dead_band, threshold))
    unseen = "the predicted gain did not show in the measured step time"
    if verdict.action == "revert":
        reason = f"do no harm: {verdict.reason}; back to equal batches"
        return Decision(
            equal, True, reason, t_equal, tuple(models), settled=False, not_helping=why or unseen
        )
    if verdict.action == "hold" and decision.changed:
        reason = f"holding equal batches until a rank's speed changes: {verdict.reason}"
        return Decision(current, False, reason, t_equal, tuple(models), not_helping=why or unseen)
    return replace(decision, not_helping=why)
