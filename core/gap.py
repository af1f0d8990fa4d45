"""Where the throughput missing from the ideal went: the gap breakdown.

Pure arithmetic over what the trainer records per interval, shared by the
trainer (its summary, ``ctx.report()``, ``hetero-train``'s table) and by
``hetero-bench report``, which recomputes it from a run's files; the definitions
are those of docs/design.md ("The gap breakdown"). Standard library only.

Per step of one interval, in seconds, for rank *i* with batch *b_i* (*B* = Σ *b_i*):

- *W*: the interval's wall time per step; *T*: the step time its ranks measured
  on settled steps (CUDA events), so *W* − *T* is time spent outside steady steps:
  the first steps at a new batch size and the boundary's own exchange;
- *D_i*, *C_i*, *O_i*: input wait, compute-only time and optimizer time;
  busy_i = *D_i* + *C_i* + *O_i*;
- alone (the ideal's measurement, data already on the device): *r_i* samples/s
  at *b_i*, *I* = Σ *r_i* the ideal, *S_i* = *b_i* / *r_i*, *C*_i* and *O*_i* its compute
  and optimizer; *w_i* = *r_i* / *I*, rank *i*'s share of the ideal, and
  *T** = *B* / *I* = Σ *w_i* *S_i*, the step time at which the job reaches the ideal.

Then, exactly, *W* − *T** = the six terms + the residual::

    exposed communication  T − max busy_i
    imbalance              max busy_i − Σ w_i busy_i
    input wait             Σ w_i D_i
    lost to overlap        Σ w_i (C_i − C*_i)
    optimizer              Σ w_i (O_i − O*_i)
    plan-change warm-up    W − T in intervals that run a new plan, beyond the usual boundary cost
    residual               the rest of W − T (boundaries), Σ w_i (C*_i + O*_i − S_i) (medians),
                           and the median interval the run reports against the window's mean

Weighted means because under a plan that balances busy time, removing a cost
*x_i* from every rank and re-balancing shortens the step by Σ *w_i* *x_i* (to first
order): each term is what fixing its cause would gain, and imbalance is what
balancing busy time would gain. A term of *x* seconds is the share *x* / *W* of
the ideal (1 − *T** / *W* is the share missing) and *x* · *I* / *W* samples/s.

Plain DDP has no compute-only time (its backward includes the wait for peers):
its imbalance comes from the solo times (max *S_i* − *T**, on the slowest rank
*c*), input wait and optimizer are *c*'s (*D_c*, *O_c* − *O*_c*), and exposed
communication is the rest of *T* − *T**, compute slowed beside the all-reduce
included. Without solo times the terms that need them are ``None`` (n/a) and
shares are of the step instead of the ideal.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hetero.core.steptimes import (
    IntervalTimes,
    RankTimes,
    Solo,
    intervals_from_records,
    solos_from_summary,
)

__all__ = [
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

#: The named terms, in the order reports list them.
TERMS = ("imbalance", "input_wait", "exposed_comm", "overlap", "optimizer", "warmup")
LABELS = {
    "imbalance": "imbalance",
    "input_wait": "input wait",
    "exposed_comm": "exposed communication",
    "overlap": "lost to overlap",
    "optimizer": "optimizer",
    "warmup": "plan-change warm-up",
    "residual": "residual",
}


@dataclass(frozen=True)
class Term:
    """One cause: seconds per step, the share of the ideal (or of the step) it costs."""

    name: str
    ms_per_step: float | None
    pct: float | None  # 100 · x / W: share of the ideal lost (without an ideal: of the step)
    samples_per_s: float | None  # x · I / W; None without an ideal
    rank: int | None = None  # the rank it concerns most
    detail: str = ""


@dataclass(frozen=True)
class RankGap:
    """One rank over the window, milliseconds per step (solo: alone at the same batch)."""

    rank: int
    batch: int
    data_ms: float | None
    compute_ms: float | None
    solo_compute_ms: float | None
    optimizer_ms: float | None
    solo_optimizer_ms: float | None
    busy_ms: float | None
    wait_ms: float | None  # step − busy: waiting for peers and the all-reduce


@dataclass(frozen=True)
class Breakdown:
    """The gap of one window of a run. ``to_dict`` is what summaries and results store."""

    method: str  # "busy" (compute-only times known) or "solo" (plain DDP)
    first_step: int
    last_step: int
    intervals: int
    step_ms: float  # W: wall time per step
    measured_step_ms: float  # T: the ranks' own step time on settled steps
    ideal_step_ms: float | None
    ideal_samples_per_s: float | None
    achieved_samples_per_s: float
    pct_of_ideal: float | None
    terms: tuple[Term, ...]
    residual: Term
    ranks: tuple[RankGap, ...]
    critical_rank: int | None
    plan_changes: int
    warmup_total_s: float
    verdict: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def term(self, name: str) -> Term:
        return next(t for t in (*self.terms, self.residual) if t.name == name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["terms"] = {
            t.name: {k: v for k, v in asdict(t).items() if k != "name"} for t in self.terms
        }
        d["residual"] = {k: v for k, v in asdict(self.residual).items() if k != "name"}
        d["notes"] = list(self.notes)
        return d


# -- the arithmetic ---------------------------------------------------------------------


@dataclass
class _Acc:
    """Step-weighted sums over the window's intervals (a ``None`` anywhere makes a sum n/a)."""

    steps: int = 0
    sums: dict[str, float | None] = field(default_factory=dict)

    def add(self, key: str, value: float | None, n: int) -> None:
        cur = self.sums.get(key, 0.0)
        self.sums[key] = None if (cur is None or value is None) else cur + value * n

    def mean(self, key: str) -> float | None:
        v = self.sums.get(key)
        return None if v is None or not self.steps else v / self.steps


def _changed(intervals: Sequence[IntervalTimes]) -> list[bool]:
    return [k > 0 and iv.plan != intervals[k - 1].plan for k, iv in enumerate(intervals)]


def _boundary_cost_s(intervals: Sequence[IntervalTimes], changed: Sequence[bool]) -> float:
    """The usual ``W − T`` of an interval that keeps its plan (the boundary's own work)."""
    vals = [
        iv.wall_per_step_s - iv.step_s
        for k, iv in enumerate(intervals)
        if k > 0 and iv.measured and not changed[k]
    ]
    return max(statistics.median(vals), 0.0) if vals else 0.0


def _wsum(w: Sequence[float], xs: Sequence[float | None]) -> float | None:
    if any(x is None for x in xs):
        return None
    return sum(wi * x for wi, x in zip(w, xs, strict=True) if x is not None)


def interval_terms(
    iv: IntervalTimes, solos: Sequence[Solo] | None, warmup_s: float
) -> dict[str, float | None]:
    """The six terms of one interval in seconds per step (see the module doc).

    ``warmup_s`` is this interval's warm-up per step, which the caller decides from the
    whole run (the usual boundary cost is learnt from intervals that keep their plan).
    """
    ranks = iv.ranks
    T = iv.step_s
    out: dict[str, float | None] = dict.fromkeys(TERMS)
    out["warmup"] = warmup_s
    ideal = sum(s.samples_per_s for s in solos) if solos else 0.0
    busy = [r.busy_s for r in ranks]
    if all(b is not None for b in busy):
        b_ = [b or 0.0 for b in busy]
        if solos and ideal > 0:
            w = [s.samples_per_s / ideal for s in solos]
        else:  # no ideal: weigh ranks by their own in-job rates, b_i / busy_i
            rates = [r.batch / b if b > 0 else 0.0 for r, b in zip(ranks, b_, strict=True)]
            total = sum(rates)
            w = [x / total for x in rates] if total > 0 else [1 / len(ranks)] * len(ranks)
        top = max(b_)
        out["exposed_comm"] = T - top
        out["imbalance"] = top - sum(wi * b for wi, b in zip(w, b_, strict=True))
        out["input_wait"] = _wsum(w, [r.data_s for r in ranks])
        if solos and ideal > 0:
            if all(s.compute_s is not None and s.optimizer_s is not None for s in solos):
                out["overlap"] = _wsum(
                    w, [_sub(r.compute_s, s.compute_s) for r, s in zip(ranks, solos, strict=True)]
                )
                out["optimizer"] = _wsum(
                    w,
                    [_sub(r.optimizer_s, s.optimizer_s) for r, s in zip(ranks, solos, strict=True)],
                )
            else:  # solo phases not measured (older runs): compute and optimizer together
                out["overlap"] = _wsum(
                    w,
                    [
                        _sub(_add(r.compute_s, r.optimizer_s), s.step_s)
                        for r, s in zip(ranks, solos, strict=True)
                    ],
                )
    elif solos and ideal > 0:
        # Plain DDP: the slowest rank alone sets the step; its own phases are exposed.
        c = max(range(len(solos)), key=lambda i: solos[i].step_s)
        mine = ranks[c]
        out["imbalance"] = solos[c].step_s - sum(iv.plan) / ideal
        out["input_wait"] = mine.data_s
        out["optimizer"] = _sub(mine.optimizer_s, solos[c].optimizer_s)
        out["exposed_comm"] = T - solos[c].step_s - (mine.data_s or 0.0) - (out["optimizer"] or 0.0)
    return out


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def breakdown(
    intervals: Sequence[IntervalTimes],
    solos: Sequence[Solo] | None = None,
    *,
    window: range | None = None,
    achieved_samples_per_s: float | None = None,
) -> Breakdown | None:
    """The gap over ``window`` (indexes of ``intervals``; default the latter half, as the
    steady figures), without words (``hetero.core.verdict.diagnose`` adds them).

    ``achieved_samples_per_s`` is the figure the run reports (a median of intervals); by
    default the window's samples over its wall time. The residual is what the named
    terms leave of ideal − achieved. ``None`` when the window has no measured interval.
    """
    if not intervals:
        return None
    if window is None:
        window = range(len(intervals) // 2, len(intervals))
    world = len(intervals[-1].ranks)
    if solos is not None and (len(solos) != world or not all(s.samples_per_s > 0 for s in solos)):
        solos = None
    notes: list[str] = []
    chosen = [k for k in window if 0 <= k < len(intervals) and intervals[k].measured]
    if solos and chosen:
        at_solo = [k for k in chosen if intervals[k].plan == tuple(s.batch for s in solos)]
        if at_solo:
            chosen = at_solo
        else:
            notes.append("the solo batches differ from the plan of the window")
    if not chosen:
        return None
    changed = _changed(intervals)
    boundary = _boundary_cost_s(intervals, changed)

    def warm(k: int) -> float:
        iv = intervals[k]
        return max(iv.wall_per_step_s - iv.step_s - boundary, 0.0) if changed[k] else 0.0

    acc = _Acc()
    for k in chosen:
        iv = intervals[k]
        acc.steps += iv.steps
        acc.add("W", iv.wall_per_step_s, iv.steps)
        acc.add("T", iv.step_s, iv.steps)
        for key, value in interval_terms(iv, solos, warm(k)).items():
            acc.add(key, value, iv.steps)
        for i, r in enumerate(iv.ranks):
            for name, v in (
                ("data", r.data_s), ("compute", r.compute_s), ("optimizer", r.optimizer_s),
                ("busy", r.busy_s), ("wait", _sub(iv.step_s, r.busy_s)),
            ):  # fmt: skip
                acc.add(f"{name}{i}", v, iv.steps)
    W = acc.mean("W") or 0.0
    last = intervals[chosen[-1]]
    B = sum(last.plan)
    ideal = sum(s.samples_per_s for s in solos) if solos else None
    achieved = achieved_samples_per_s or (B / W if W > 0 else 0.0)
    ddp = any(r.compute_s is None for r in last.ranks)
    mean_busy = [acc.mean(f"busy{i}") for i in range(world)]
    crit = (
        max(range(world), key=lambda i: mean_busy[i] or 0.0)
        if all(b is not None for b in mean_busy)
        else None
    )
    if crit is None and solos and ddp:
        crit = max(range(world), key=lambda i: solos[i].step_s)

    def term(name: str, x: float | None) -> Term:
        return Term(
            name,
            None if x is None else x * 1e3,
            None if x is None or W <= 0 else 100.0 * x / W,
            None if x is None or not ideal or W <= 0 else x * ideal / W,
        )

    terms = tuple(term(name, acc.mean(name)) for name in TERMS)
    if ideal and W > 0:
        named = sum(t.samples_per_s for t in terms if t.samples_per_s is not None)
        residual = term("residual", (ideal - achieved - named) * W / ideal)
    else:
        residual = term("residual", None)
        notes.append("no solo measurement: shares are of the step; overlap and optimizer n/a")
    if ddp:
        notes.append(
            "plain DDP: imbalance from the solo step times; exposed communication includes "
            "compute slowed beside the all-reduce (its backward includes the wait for peers)"
        )
    ranks = tuple(
        RankGap(
            rank=i,
            batch=last.ranks[i].batch,
            data_ms=_ms(acc.mean(f"data{i}")),
            compute_ms=_ms(acc.mean(f"compute{i}")),
            solo_compute_ms=_ms(solos[i].compute_s) if solos else None,
            optimizer_ms=_ms(acc.mean(f"optimizer{i}")),
            solo_optimizer_ms=_ms(solos[i].optimizer_s) if solos else None,
            busy_ms=_ms(acc.mean(f"busy{i}")),
            wait_ms=_ms(acc.mean(f"wait{i}")),
        )
        for i in range(world)
    )
    run_changes = [k for k in range(len(intervals)) if changed[k] and intervals[k].measured]
    return Breakdown(
        method="solo" if ddp else "busy",
        first_step=intervals[chosen[0]].end_step - intervals[chosen[0]].steps,
        last_step=last.end_step,
        intervals=len(chosen),
        step_ms=W * 1e3,
        measured_step_ms=(acc.mean("T") or W) * 1e3,
        ideal_step_ms=B / ideal * 1e3 if ideal else None,
        ideal_samples_per_s=ideal,
        achieved_samples_per_s=achieved,
        pct_of_ideal=100.0 * achieved / ideal if ideal else None,
        terms=terms,
        residual=residual,
        ranks=ranks,
        critical_rank=crit,
        plan_changes=len(run_changes),
        warmup_total_s=sum(warm(k) * intervals[k].steps for k in run_changes),
        notes=tuple(notes),
    )


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3
