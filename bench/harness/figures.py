"""The figures of a benchmark run, as pure functions of per-interval metrics.

An *interval* is one record of ``metrics/rank<R>.jsonl``: the ``rebalance_interval``
steps that end at its ``step`` (so record ``step = k`` covers steps
``k − interval … k − 1``), with the job's ``samples_per_s`` over that
interval's wall time and this rank's mean compute-only seconds per step.

- steady window: the latter half of a phase's intervals (at least one), so
  start-up, warm-up and re-planning stay out of it;
- samples/s: the median interval throughput over the steady window;
- load imbalance: per interval ``max_i(compute_i) / mean_i(compute_i) − 1``,
  median over the steady window (0 = every rank computes equally long);
- adaptation: after a change, the intervals until the throughput first comes
  within ``tol`` (5%) of the new phase's steady throughput and stays there for
  ``hold`` intervals; ``0`` means the first interval containing the change
  already was;
- GPU utilization: mean NVML ``utilization.gpu`` (%) per GPU over the window's
  wall-clock span;
- plan changes per 20 intervals: the run's plan changes over its intervals × 20;
- a plan change's cost in steps: the busy seconds its first steps at the new batch
  took beyond the settled steps' median (``switch_s``, per rank, in the record of
  the interval it landed in) over that rank's median settled step (``step_s``), the
  largest over the ranks: the job waits for its slowest rank;
- why the plan held still: the planner's own words (``not_helping``), else the
  reason it gave at the boundaries where it kept the plan; the one said most often.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Per 20 intervals: the unit of the plan-stability target (issue 31).
CHANGES_PER = 20
#: A record's explicit cost of the plan change it measured, in steps, where the
#: trainer writes one; else ``switch_s / step_s``.
SWITCH_STEPS_FIELD = "switch_steps"


@dataclass(frozen=True)
class Phase:
    """Intervals ``[start, end)`` between two changes; ``label`` says what began it."""

    start: int
    end: int
    label: str

    @property
    def steady(self) -> range:
        return steady_window(self.start, self.end)


def steady_window(start: int, end: int) -> range:
    """The latter half of intervals ``[start, end)``: at least one when the phase has any."""
    if end <= start:
        return range(start, start)
    return range(start + (end - start) // 2, end)


def median_rate(rates: Sequence[float], window: range) -> float | None:
    """Median of ``rates`` over ``window`` (samples/s); ``None`` for an empty window."""
    vals = [rates[i] for i in window if 0 <= i < len(rates)]
    return statistics.median(vals) if vals else None


def whole_run_rate(rates: Sequence[float], walls_s: Sequence[float]) -> float | None:
    """Samples over seconds of every interval but the first (start-up and warm-up), samples/s."""
    pairs = list(zip(rates, walls_s, strict=True))[1:] or list(zip(rates, walls_s, strict=True))
    wall = sum(w for _, w in pairs)
    return sum(r * w for r, w in pairs) / wall if wall > 0 else None


def interval_imbalance(compute_s: Sequence[float | None]) -> float | None:
    """``max/mean − 1`` of one interval's per-rank compute seconds; ``None`` if any is missing."""
    if not compute_s or any(c is None or c <= 0 for c in compute_s):
        return None
    vals = [float(c) for c in compute_s if c is not None]
    return max(vals) / (sum(vals) / len(vals)) - 1.0


def imbalance(per_interval: Sequence[Sequence[float | None]], window: range) -> float | None:
    """Median of the per-interval imbalance over ``window``; ``None`` when none is known."""
    vals = [
        v
        for i in window
        if 0 <= i < len(per_interval) and (v := interval_imbalance(per_interval[i])) is not None
    ]
    return statistics.median(vals) if vals else None


def adaptation_intervals(
    rates: Sequence[float], phase: Phase, *, tol: float = 0.05, hold: int = 2
) -> int | None:
    """Intervals from the start of ``phase`` until throughput settles within ``tol`` of its
    steady value for ``hold`` consecutive intervals (fewer if the phase ends first);
    ``None`` if it never does or the phase is empty."""
    target = median_rate(rates, phase.steady)
    if not target:
        return None
    end = min(phase.end, len(rates))
    for i in range(phase.start, end):
        run = range(i, min(i + hold, end))
        if all(abs(rates[j] / target - 1.0) <= tol for j in run):
            return i - phase.start
    return None


def phases(
    steps: Sequence[int], changes: Sequence[tuple[int, str]], first_label: str = "start"
) -> list[Phase]:
    """Cut intervals (record steps, ascending) at each change step.

    A change at step ``s`` begins a phase at the first interval that contains a
    step ``>= s`` (record step ``> s``); changes past the last interval are dropped.
    """
    bounds: list[tuple[int, str]] = [(0, first_label)]
    for step, label in sorted(changes):
        idx = next((i for i, k in enumerate(steps) if k > step), None)
        if idx is None:
            continue
        if idx == bounds[-1][0]:
            bounds[-1] = (idx, label)
        else:
            bounds.append((idx, label))
    ends = [b for b, _ in bounds[1:]] + [len(steps)]
    return [Phase(start, end, label) for (start, label), end in zip(bounds, ends, strict=True)]


def mean_utilization(
    samples: Sequence[tuple[float, Sequence[float | None]]], t0: float, t1: float
) -> list[float | None]:
    """Mean utilization (%) per GPU of the samples taken in ``[t0, t1]`` (seconds)."""
    inside = [u for t, u in samples if t0 <= t <= t1]
    if not inside:
        return []
    out: list[float | None] = []
    for g in range(len(inside[0])):
        vals = [u[g] for u in inside if g < len(u) and u[g] is not None]
        out.append(sum(v for v in vals if v is not None) / len(vals) if vals else None)
    return out


def changes_per_intervals(changes: int, intervals: int, per: int = CHANGES_PER) -> float | None:
    """Plan changes per ``per`` intervals; ``None`` without intervals."""
    return changes * per / intervals if intervals > 0 else None


def change_costs_steps(ranks: Sequence[Sequence[Mapping[str, Any]]]) -> list[tuple[int, float]]:
    """(record step, cost in steps) of every plan change a rank measured (module doc),
    in step order; a change no settled step measured is absent. A rank's first record
    is no plan change: its ``switch_s`` is what the run's first batch size cost."""
    by_step: dict[int, float] = {}
    for records in ranks:
        for rec in records[1:]:
            cost = rec.get(SWITCH_STEPS_FIELD)
            if cost is None:
                switch, step = rec.get("switch_s"), rec.get("step_s")
                cost = switch / step if switch is not None and step else None
            if cost is not None:
                k = int(rec["step"])
                by_step[k] = max(by_step.get(k, 0.0), float(cost))
    return sorted(by_step.items())


def why_held(rank0: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the plan held still (module doc); ``None`` where no boundary kept a plan
    with a reason (plain DDP, a run without metrics)."""
    # By cause, without the figures each boundary words them with.
    said = [_causes(str(r["not_helping"])) for r in rank0 if r.get("not_helping")]
    if said:
        return f"hetero is not helping here: {_commonest(said, len(rank0))}"
    kept = [_gist(r["reason"]) for r in rank0 if r.get("reason") and not r.get("plan_changed")]
    return _commonest(kept, len(rank0)) if kept else None


def _commonest(texts: Sequence[str], boundaries: int) -> str:
    """The text said most often (the newest of a tie), with how often."""
    counts = Counter(texts)
    top = max(counts.values())
    text = next(t for t in reversed(texts) if counts[t] == top)
    return f"{text} (at {top} of {boundaries} boundaries)"


def _causes(not_helping: str) -> str:
    """The causes a planner's ``not_helping`` names ("devices alike, input-bound"),
    without their parenthesised figures."""
    return re.sub(r"\s*\([^()]*(\([^()]*\)[^()]*)*\)", "", not_helping).strip()


def _gist(reason: str) -> str:
    """A reason without its figures: the first clause, parentheses dropped."""
    return re.sub(r"\s*\([^)]*\)", "", str(reason).split(";")[0]).strip()
