"""Where the throughput missing from the ideal went: the gap breakdown.

Pure arithmetic over what the trainer records per interval, shared by the
trainer (its summary, ``ctx.report()``, ``hetero-train``'s table) and by
``hetero-bench report``, which recomputes it from a run's files; the definitions
are those of docs/design.md ("The gap breakdown"). Standard library only.

**One step time.** *W* is the window's wall time per step (its wall time over its
steps): the achieved rate is *B* / *W*. The ideal step is *T** = *B* / *I*, *I* = Σ *r_i*
the ranks' solo rates, and the gap *W* − *T** is split into terms that are each ≥ 0
and sum to it. Per step, for rank *i* with batch *b_i* and share *w_i* = *r_i* / *I* of the
ideal (*S_i* = *b_i* / *r_i* its solo step), every phase a mean over the same settled
steps, so they add up to the rank's mean step *M_i* = *D_i* + *C_i* + *X_i* + *O_i*
(input wait, compute, gradients ready → all-reduce done, optimizer). With *c* each
interval's busiest rank (busy = *D* + *C* + *O*; ``hetero.core.critpath``), exactly::

    W − T* =  (W − M_c)                 outside the steps: boundary exchange + pauses
            + X_c                        exposed communication (c waits least for peers)
            + busy_c − Σ w_i busy_i      imbalance (≥ 0: c has the largest busy time)
            + Σ w_i D_i                  input wait
            + Σ w_i (C_i + O_i) − T*     slower than alone: lost to overlap + optimizer

Intervals that run a new plan (the first steps at a new batch size; on the DataLoader
path the workers restarting) count, beyond the steady pace *W_s* of the window's
intervals that kept their plan, as **plan changes**; the rest of their time is
split as the steady intervals' is. Time outside the steps of a kept plan is the
**boundary exchange** up to its usual per-step cost (the median over the run) and
**pauses** beyond it (evaluation, checkpoints).

**Noise.** Two things only can come out below zero: the job's own work against the
solo measurement (a phase faster in the job than alone: the solo run times each
phase around a device sync, a sharded optimizer steps a shard), and an interval
faster than the reference step. Within the first, a phase faster in the job offsets
the other (the solo phase medians are scaled to add up to the solo step); a credit
left over is taken off the other terms in proportion (``scale`` < 1, said in a note
when over 2%). An interval whose settled steps say more than its wall time has its
phases fitted to it (``steptimes.fit``). Nothing is kept as a residual: the terms sum
to the gap, or the breakdown says it does not add up.

Plain DDP has no compute-only time (its backward includes the wait for peers):
*c* is the rank slowest alone, imbalance is *S_c* − *T** (equal batches), input wait
and optimizer are *c*'s, and exposed communication is the rest of *c*'s step beyond
its solo compute, compute slowed beside the all-reduce included. Without a solo
measurement the gap is taken from the ranks' own work in the job (Σ *w_i* (*C_i* + *O_i*),
weights from their in-job rates) and shares are of the step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hetero.core.critpath import TERMS, Parts, settle, terms_of
from hetero.core.steptimes import (
    IntervalTimes,
    RankTimes,
    Solo,
    changed,
    intervals_from_records,
    solos_from_summary,
    usual_boundary_s,
)
from hetero.core.wholerun import WholeRun, whole_run

__all__ = [
    "LABELS",
    "TERMS",
    "Breakdown",
    "IntervalTimes",
    "RankGap",
    "RankTimes",
    "Solo",
    "Term",
    "breakdown",
    "intervals_from_records",
    "solos_from_summary",
]

LABELS = {
    "imbalance": "imbalance",
    "input_wait": "input wait",
    "exposed_comm": "exposed communication",
    "overlap": "lost to overlap",
    "optimizer": "optimizer",
    "plan_changes": "plan changes",
    "boundary": "boundary exchange",
    "pauses": "pauses between steps",
}
#: Σ terms may miss the gap by this share of it (float rounding; the sum is exact).
TOLERANCE = 0.02


@dataclass(frozen=True)
class Term:
    """One cause: seconds per step, the share of the ideal (or of the step) it costs."""

    name: str
    ms_per_step: float | None  # None: not measurable here (n/a)
    pct: float | None  # 100 · x / W: share of the ideal lost (without an ideal: of the step)
    samples_per_s: float | None  # x · I / W; None without an ideal
    rank: int | None = None  # the rank it concerns most
    detail: str = ""


@dataclass(frozen=True)
class RankGap:
    """One rank over the window's steady intervals, ms per step (solo: alone, same batch)."""

    rank: int
    batch: int
    data_ms: float | None
    compute_ms: float | None
    solo_compute_ms: float | None
    optimizer_ms: float | None
    solo_optimizer_ms: float | None
    busy_ms: float | None
    wait_ms: float | None  # gradients ready → all-reduce done: the all-reduce and the peers
    input_ms: float | None = None  # the loader's workers' time per batch (None: not recorded)


@dataclass(frozen=True)
class Breakdown:
    """The gap of one window of a run. ``to_dict`` is what summaries and results store."""

    method: str  # "busy" (compute-only times known) or "solo" (plain DDP)
    first_step: int
    last_step: int
    intervals: int
    steps: int  # the window's steps (its intervals may leave out those at another plan)
    step_ms: float  # W: the window's wall time per step, the one step time
    reference_ms: float  # T* (the ideal step), or without one the ranks' own work
    gap_ms: float  # W − reference; the terms sum to max(gap_ms, 0)
    ideal_samples_per_s: float | None
    achieved_samples_per_s: float  # B / W
    median_samples_per_s: float  # the run's steady figure: a median interval (latter half)
    pct_of_ideal: float | None
    terms: tuple[Term, ...]
    ranks: tuple[RankGap, ...]
    critical_rank: int | None
    plan_changes: int  # intervals of the window that ran a new plan
    scale: float  # ≤ 1: the factor that took a credit (the job faster than alone) off
    adds_up: bool
    largest: str | None  # the term of most ms per step (None: no gap)
    whole_run: WholeRun | None = None
    verdict: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["terms"] = {
            t.name: {k: v for k, v in asdict(t).items() if k != "name"} for t in self.terms
        }
        d["notes"] = list(self.notes)
        return d


def breakdown(
    intervals: Sequence[IntervalTimes],
    solos: Sequence[Solo] | None = None,
    *,
    window: range | None = None,
    steady_samples_per_s: float | None = None,
) -> Breakdown | None:
    """The gap over ``window`` (indexes of ``intervals``; default the latter half, as the
    steady figure), without words (``hetero.core.verdict.diagnose`` adds them).

    ``steady_samples_per_s`` is the figure the run reports (a median of intervals; by
    default the window's median), which the whole-run account sets beside the whole
    run's. ``None`` when the window has no measured interval."""
    if not intervals:
        return None
    if window is None:
        window = range(len(intervals) // 2, len(intervals))
    world = len(intervals[-1].ranks)
    if solos is not None and (len(solos) != world or not all(s.samples_per_s > 0 for s in solos)):
        solos = None
    notes: list[str] = []
    chosen = [k for k in window if 0 <= k < len(intervals) and len(intervals[k].ranks) == world]
    # The intervals at one plan: the solo batches (the ideal's), else the plan that ran
    # last; the reference step is that plan's.
    if chosen:
        plan = tuple(s.batch for s in solos) if solos else intervals[chosen[-1]].plan
        at_plan = [k for k in chosen if intervals[k].plan == plan]
        if at_plan:
            chosen = at_plan
        else:
            notes.append("the solo batches differ from the plan of the window")
    if not any(intervals[k].measured for k in chosen):
        return None
    flags = changed(intervals)
    kept = [k for k in chosen if not flags[k] and intervals[k].measured]
    base = kept or [k for k in chosen if intervals[k].measured]
    parts = terms_of(
        [intervals[k] for k in base],
        solos,
        usual_boundary_s(intervals, flags),
        "pauses" if kept else "plan_changes",
    )
    steps = sum(intervals[k].steps for k in chosen)
    raw = _window_terms(parts, [(intervals[k], flags[k]) for k in chosen if k not in base])
    ddp = parts.ranks[0]["busy_s"] is None
    settle(raw, ("exposed_comm", "optimizer") if ddp else ("overlap", "optimizer"))
    W = sum(intervals[k].wall_s for k in chosen) / steps
    gap = W - parts.reference_s
    target = max(gap, 0.0)
    vals, scale, measured = _absorb(raw, target)
    adds_up = abs(sum(v for v in vals.values() if v is not None) - target) <= (
        TOLERANCE * target + 1e-9
    )
    if scale < 1.0 - TOLERANCE and gap > 0:
        notes.append(
            f"the terms measure {measured * 1e3:.1f} ms/step against a gap of "
            f"{target * 1e3:.1f}: the job beat its reference somewhere (a phase faster in the "
            f"job than alone, which the solo run times around a device sync, or an interval "
            f"faster than the window's own measured work), so they are scaled by {scale:.2f}"
        )
    ideal = sum(s.samples_per_s for s in solos) if solos else None
    B = sum(intervals[chosen[-1]].plan)
    latter = [intervals[k] for k in window if 0 <= k < len(intervals)]
    median = statistics.median(sum(iv.plan) * iv.steps / iv.wall_s for iv in latter)
    if not solos:
        notes.append("no solo measurement: shares are of the step; overlap and optimizer n/a")
    if ddp:
        notes.append(
            "plain DDP: imbalance from the solo step times; exposed communication includes "
            "compute slowed beside the all-reduce (its backward includes the wait for peers)"
        )

    def term(name: str, x: float | None) -> Term:
        return Term(
            name,
            None if x is None else x * 1e3,
            None if x is None else 100.0 * x / W,
            None if x is None or not ideal else x * ideal / W,
            rank=parts.term_ranks.get(name),
        )

    terms = tuple(term(t, vals[t]) for t in TERMS)
    # A gap under 1 ns per step is none (float rounding of a job at its reference).
    positive = [t for t in terms if (t.ms_per_step or 0.0) > 0] if target > 1e-9 else []
    first = intervals[chosen[0]]
    return Breakdown(
        method="solo" if ddp else "busy",
        first_step=first.end_step - first.steps,
        last_step=intervals[chosen[-1]].end_step,
        intervals=len(chosen),
        steps=steps,
        step_ms=W * 1e3,
        reference_ms=parts.reference_s * 1e3,
        gap_ms=gap * 1e3,
        ideal_samples_per_s=ideal,
        achieved_samples_per_s=B / W,
        median_samples_per_s=steady_samples_per_s or median,
        pct_of_ideal=100.0 * B / W / ideal if ideal else None,
        terms=terms,
        ranks=_rank_gaps(parts, intervals[base[-1]], solos),
        critical_rank=parts.critical,
        plan_changes=sum(1 for k in chosen if flags[k] and k > 0),
        scale=scale,
        adds_up=adds_up,
        largest=max(positive, key=lambda t: t.ms_per_step or 0.0).name if positive else None,
        whole_run=whole_run(intervals, steady_samples_per_s or median),
        notes=tuple(notes),
    )


def _window_terms(
    parts: Parts, others: Sequence[tuple[IntervalTimes, bool]]
) -> dict[str, float | None]:
    """Per step of the window: the base intervals at their own terms (``parts``), and each
    other interval (one that ran a new plan, flag True, or was not measured) as its time
    beyond the base's pace (plan changes, or pauses) plus the base's terms for the rest
    of its time. An interval faster than the reference adds nothing: the gap it takes
    off is what ``_absorb`` takes off the terms."""
    total = {t: None if v is None else v * parts.steps for t, v in parts.raw.items()}
    room = parts.step_s - parts.reference_s
    for iv, moved in others:
        over = max(iv.wall_per_step_s - parts.step_s, 0.0)
        excess = "plan_changes" if moved else "pauses"
        total[excess] = (total[excess] or 0.0) + over * iv.steps
        share = max(min(iv.wall_per_step_s, parts.step_s) - parts.reference_s, 0.0)
        f = share / room if room > 0 else 0.0
        for t, v in parts.raw.items():
            if v is not None and total[t] is not None:
                total[t] = (total[t] or 0.0) + f * v * iv.steps
    steps = parts.steps + sum(iv.steps for iv, _ in others)
    return {t: None if v is None else v / steps for t, v in total.items()}


def _absorb(
    raw: dict[str, float | None], target: float
) -> tuple[dict[str, float | None], float, float]:
    """The terms ≥ 0 scaled to sum to ``target`` (the gap, or 0 at or above the ideal),
    the scale (1 where they already do, up to float rounding) and what they measured."""
    measured = sum(max(v, 0.0) for v in raw.values() if v is not None)
    scale = target / measured if measured > target * (1 + 1e-9) + 1e-12 else 1.0
    return {t: None if v is None else max(v, 0.0) * scale for t, v in raw.items()}, scale, measured


def _rank_gaps(
    parts: Parts, last: IntervalTimes, solos: Sequence[Solo] | None
) -> tuple[RankGap, ...]:
    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1e3

    return tuple(
        RankGap(
            rank=i,
            batch=last.ranks[i].batch,
            data_ms=ms(p["data_s"]),
            compute_ms=ms(p["compute_s"]),
            solo_compute_ms=ms(solos[i].compute_s) if solos else None,
            optimizer_ms=ms(p["optimizer_s"]),
            solo_optimizer_ms=ms(solos[i].optimizer_s) if solos else None,
            busy_ms=ms(p["busy_s"]),
            wait_ms=ms(p["comm_s"]),
            input_ms=ms(p["input_s"]),
        )
        for i, p in enumerate(parts.ranks)
    )
