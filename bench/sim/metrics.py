"""From a simulated run to the numbers ``hetero-bench sim`` reports.

**Ideal** (``docs/design.md``, "The yardstick"): the sum over ranks of each
rank's standalone throughput at its *planned* batch, ``Σ b_i / (t_i(b_i) + comm)``
with ``t_i`` the rank's true, noise-free compute time at that step (drift and
neighbours included). Two choices make it a measure of the *plan*, which is
what a policy controls:

* The all-reduce cost ``comm`` is charged to the ideal too: no plan removes it,
  so a perfectly balanced plan scores 100%, not ``T/(T + comm)``.
* The achieved side uses noise-free times as well (``max_i t_i(b_i) + comm``).
  Per-step jitter makes every synchronous step wait for the unluckiest rank
  (``E[max] > max E``) whatever the plan; that cost shows in ``samples_per_s``
  (the noisy simulated wall time), not in ``pct_of_ideal``.

The ideal is not always reachable at a fixed global batch: a rank pinned at its
memory cap finishes early and waits, and integer batches cannot balance
exactly. ``pct_of_best`` therefore also compares with the *oracle*: the best
integer plan for the workers' true state (``cluster.best_plan``).

**Steady state** leaves out the first ``settle_intervals`` intervals and, for
each sudden change, the interval containing it and the ``settle_intervals``
after it. Percentages over several intervals are ratios of summed times, i.e.
of throughputs over that span.

**Re-convergence** after a sudden change at step s: the number of intervals,
counted from the first one that starts at or after s, that run below 95% of
the (new) ideal before the first one at or above it. 0: the change never hurt
the plan; 1: the best a policy that must first measure the change can do.

**Plan within 5%** after a sudden change at step s: the intervals from the one
containing s until the first whose plan, noise-free and *without* the warm-up
of a plan change, runs within 5% of the oracle plan's step
(``plan_within``). The interval containing the change ran the old plan, so 1
is a first move that landed and 2 a second one; it says how fast the planner
finds the plan, where adaptation also charges what its moves cost.

**Adaptation** after a sudden change, as ``hetero-bench run`` counts it on GPUs
(``bench/harness/figures.py``): the intervals from the first one containing
the change until the job's throughput, noise-free and *with* the warm-up of
every plan change it paid, is within 5% of the new phase's steady value for
two intervals in a row. Re-convergence only asks whether the plan is right;
adaptation also charges the moves it took to get there.

**Churn**: per steady interval, the share of the global batch that moved to
another rank, ``Σ_i |Δb_i| / 2 / B``, averaged, in percent. **Plan changes**:
how many plans the policy adopted over the steady intervals. **Order**: the
share of intervals, from the one after the first plan change on, whose plan
gives no truly slower rank as many samples as a faster one (percent).

**Stragglers**: an episode is a run of consecutive intervals in which the
detector flags a rank. It is a false positive if, in its first interval, the
rank's true per-sample time was not above the detector's threshold times the
other ranks' median. ``flag_latency_intervals`` is the worst, over runs of a
true straggler lasting at least ``consecutive`` intervals, of the number of
intervals from the run's first to the first flagged (inclusive); such a run
never flagged counts in ``stragglers_missed``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hetero.bench.harness.figures import adaptation_intervals, phases
from hetero.bench.sim.engine import IntervalRecord, SimRun

#: Share of the new ideal that counts as re-converged after a sudden change (percent).
RECONVERGED_PCT = 95.0


@dataclass(frozen=True)
class SimResult:
    """One row of ``hetero-bench sim``: one policy on one scenario (all simulated)."""

    scenario: str
    policy: str
    workers: int
    intervals: int
    pct_of_ideal: float
    pct_of_best: float
    samples_per_s: float
    reconverge_intervals: int | None
    reconverged: bool
    churn_pct: float
    stragglers_flagged: int
    false_positives: int
    flag_latency_intervals: int | None
    stragglers_missed: int
    speedup_vs_equal: float | None = None
    adapt_intervals: int | None = None
    plan_changes: int = 0
    order_pct: float | None = None
    simulated: bool = True

    def row(self) -> dict[str, object]:
        return asdict(self)


def summarize(run: SimRun) -> SimResult:
    """The reported numbers for one run (see the module doc for every definition)."""
    recs = run.intervals
    steady = steady_intervals(run)
    chosen = [recs[j] for j in steady] or list(recs)
    per_change = [
        outcome
        for change in run.scenario.change_steps
        if (outcome := reconverge(run, change)) is not None
    ]
    flagged, false_pos, latency, missed = _straggler_counts(run)
    total_samples = sum(r.steps for r in recs) * run.scenario.global_batch
    return SimResult(
        scenario=run.scenario.name,
        policy=run.policy,
        workers=len(run.scenario.workers),
        intervals=len(recs),
        pct_of_ideal=100.0 * sum(r.ideal_s for r in chosen) / sum(r.plan_s for r in chosen),
        pct_of_best=100.0 * sum(r.best_s for r in chosen) / sum(r.plan_s for r in chosen),
        samples_per_s=total_samples / sum(r.wall_s for r in recs),
        reconverge_intervals=max((n for n, _ in per_change), default=None),
        reconverged=all(ok for _, ok in per_change),
        churn_pct=churn_pct(run, steady),
        stragglers_flagged=flagged,
        false_positives=false_pos,
        flag_latency_intervals=latency,
        stragglers_missed=missed,
        adapt_intervals=adaptation(run),
        plan_changes=sum(1 for j in steady if j > 0 and recs[j].batches != recs[j - 1].batches),
        order_pct=order_pct(run),
    )


def order_pct(run: SimRun) -> float | None:
    """Percent of intervals after the first plan change whose plan is ordered by speed."""
    recs = run.intervals
    first = next((j for j, r in enumerate(recs) if r.changed), None)
    after = recs[first + 1 :] if first is not None else ()
    return 100.0 * sum(r.ordered for r in after) / len(after) if after else None


def adaptation(run: SimRun) -> int | None:
    """The worst adaptation over the run's sudden changes (module doc); None without
    changes, or if the throughput never settled after one."""
    recs = run.intervals
    steps = [r.start_step + r.steps for r in recs]
    changes = [(s, "change") for s in run.scenario.change_steps]
    if not changes:
        return None
    rates = [r.steps * run.scenario.global_batch / r.plan_s for r in recs]
    worst: int | None = None
    for phase in phases(steps, changes)[1:]:
        n = adaptation_intervals(rates, phase)
        if n is None:
            return None
        worst = max(worst or 0, n)
    return worst


def steady_intervals(run: SimRun) -> list[int]:
    """Indices of the steady-state intervals."""
    settle = run.scenario.settle_intervals
    excluded = set(range(settle))
    for change in run.scenario.change_steps:
        j = _containing(run.intervals, change)
        if j is not None:
            excluded.update(range(j, j + settle + 1))
    return [j for j in range(len(run.intervals)) if j not in excluded]


def reconverge(run: SimRun, change_step: int) -> tuple[int, bool] | None:
    """(intervals below 95% after the change, whether it got back) or None past the end."""
    recs = run.intervals
    first = next((j for j, r in enumerate(recs) if r.start_step >= change_step), None)
    if first is None:
        return None
    for k, rec in enumerate(recs[first:]):
        if rec.pct_of_ideal >= RECONVERGED_PCT:
            return k, True
    return len(recs) - first, False


def plan_within(run: SimRun, change_step: int) -> int | None:
    """Intervals from the one containing ``change_step`` until the plan, warm-up aside,
    is within 5% of the oracle's step (module doc); None if it never is."""
    recs = run.intervals
    first = next((j for j, r in enumerate(recs) if r.start_step + r.steps > change_step), None)
    if first is None:
        return None
    for k, rec in enumerate(recs[first:]):
        if 100.0 * rec.best_s / (rec.plan_s - rec.switch_s) >= RECONVERGED_PCT:
            return k
    return None


def churn_pct(run: SimRun, indices: list[int]) -> float:
    """Mean share of B that moved rank between consecutive plans, over ``indices``."""
    b = run.scenario.global_batch
    moves = [
        sum(
            abs(x - y)
            for x, y in zip(run.intervals[j].batches, run.intervals[j - 1].batches, strict=True)
        )
        / 2
        / b
        for j in indices
        if j > 0
    ]
    return 100.0 * sum(moves) / len(moves) if moves else 0.0


def _straggler_counts(run: SimRun) -> tuple[int, int, int | None, int]:
    """(true episodes, false-positive episodes, worst latency, missed true runs)."""
    threshold = run.detector.threshold
    recs = run.intervals
    true_eps = false_eps = missed = 0
    latency: int | None = None
    for rank in range(len(run.scenario.workers)):
        flags = [rank in r.flagged for r in recs]
        slow = [(r.true_ratios[rank] or 0.0) > threshold for r in recs]
        for j, flagged in enumerate(flags):
            if flagged and (j == 0 or not flags[j - 1]):
                if slow[j]:
                    true_eps += 1
                else:
                    false_eps += 1
        for start, end in _runs(slow):
            if end - start < run.detector.consecutive:
                continue  # too short for any detector that asks for that many intervals
            hit = next((j for j in range(start, end) if flags[j]), None)
            if hit is None:
                missed += 1
            else:
                latency = max(latency or 0, hit - start + 1)
    return true_eps, false_eps, latency, missed


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of True."""
    out = []
    start: int | None = None
    for j, v in enumerate([*mask, False]):
        if v and start is None:
            start = j
        elif not v and start is not None:
            out.append((start, j))
            start = None
    return out


def _containing(recs: tuple[IntervalRecord, ...], step: int) -> int | None:
    for j, r in enumerate(recs):
        if r.start_step <= step < r.start_step + r.steps:
            return j
    return None
