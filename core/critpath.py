"""The gap's identity over a set of intervals, along each interval's critical rank.

Per step of an interval, for rank *i* with share *w_i* of the ideal, every phase a mean
over the same settled steps so that they add up to the rank's mean step *M_i*, and *c*
the interval's busiest rank (busy = input wait *D* + compute *C* + optimizer *O*)::

    W − T* = (W − M_c) + X_c + (busy_c − Σ w_i busy_i) + Σ w_i D_i + (Σ w_i (C_i + O_i) − T*)

(time outside the steps, *c*'s wait from its gradients ready to the all-reduce done,
imbalance, input wait, and the ranks' own work against alone). Each interval has its
own *c*: a rank whose loader stalls at an epoch's start is the critical path of that
interval, and the rank busiest on average only waits for it. Every term but the last
is ≥ 0 by construction; the last compares the job with the solo measurement and has
either sign (``settle`` and ``hetero.core.gap`` say what becomes of that). The terms
of a set of intervals are the step-weighted means. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.steptimes import IntervalTimes, Solo, fit

#: The terms, in the order reports list them; every one ≥ 0, together the gap.
TERMS = (
    "imbalance",
    "input_wait",
    "exposed_comm",
    "overlap",
    "optimizer",
    "plan_changes",
    "boundary",
    "pauses",
)


@dataclass
class Parts:
    """Raw per-step terms of a set of intervals (``None``: n/a), its pace and reference."""

    steps: int
    step_s: float  # W of the set
    reference_s: float
    raw: dict[str, float | None]
    critical: int  # the rank critical for most of the steps
    term_ranks: dict[str, int]  # the rank that imbalance and exposed communication sit on most
    ranks: list[dict[str, float | None]]  # per rank, step-weighted phase means


_ATTRS = ("data_s", "compute_s", "comm_s", "optimizer_s", "step_s")


def _fitted(iv: IntervalTimes) -> list[dict[str, float | None]]:
    """Each rank's phases of the interval, fitted to its wall time (``steptimes.fit``)."""
    f = fit(iv)
    out = []
    for r in iv.ranks:
        p: dict[str, float | None] = {
            a: None if (v := getattr(r, a)) is None else v * f for a in _ATTRS
        }
        busy = r.busy_s
        p["busy_s"] = None if busy is None else busy * f
        out.append(p)
    return out


def terms_of(
    ivs: Sequence[IntervalTimes], solos: Sequence[Solo] | None, boundary_s: float, excess: str
) -> Parts:
    """The identity of the module doc over measured intervals ``ivs``, interval by
    interval, then step-weighted. The time outside the steps up to ``boundary_s`` per
    step is the boundary exchange, beyond it ``excess`` (pauses, or plan changes)."""
    n = sum(iv.steps for iv in ivs)
    world = len(ivs[0].ranks)
    per = [_fitted(iv) for iv in ivs]

    def mean(i: int, a: str) -> float | None:
        vals = [p[i][a] for p in per]
        if any(v is None for v in vals):
            return None
        return sum((v or 0.0) * iv.steps for v, iv in zip(vals, ivs, strict=True)) / n

    ranks = [{a: mean(i, a) for a in (*_ATTRS, "busy_s")} for i in range(world)]
    for i, r in enumerate(ranks):  # the loader's own pace, unfitted: not a timed phase
        known = [iv.ranks[i].input_s for iv in ivs]
        r["input_s"] = (
            None
            if any(x is None for x in known)
            else sum((x or 0.0) * iv.steps for x, iv in zip(known, ivs, strict=True)) / n
        )
    busy_method = all(r["busy_s"] is not None for r in ranks)
    ideal = sum(s.samples_per_s for s in solos) if solos else 0.0
    if solos:
        w = [s.samples_per_s / ideal for s in solos]
    elif busy_method:  # no ideal: weigh ranks by their own in-job rates, b_i / busy_i
        rates = [b / (r["busy_s"] or 1.0) for b, r in zip(ivs[-1].plan, ranks, strict=True)]
        w = [x / sum(rates) for x in rates]
    else:
        w = [1 / world] * world
    split = _solo_split(solos) if solos else None
    if solos:
        ddp_c = max(range(world), key=lambda i: solos[i].step_s)
    else:
        ddp_c = max(range(world), key=lambda i: ranks[i]["data_s"] or 0.0)
    sums: dict[str, float] = dict.fromkeys((*TERMS, "work"), 0.0)
    on: dict[str, list[float]] = {"imbalance": [0.0] * world, "exposed_comm": [0.0] * world}
    critical = [0] * world
    for iv, p in zip(ivs, per, strict=True):
        k = iv.steps
        D = [x["data_s"] or 0.0 for x in p]
        O = [x["optimizer_s"] or 0.0 for x in p]  # noqa: E741 (the optimizer's letter)
        if busy_method:
            busy = [x["busy_s"] or 0.0 for x in p]
            C = [x["compute_s"] or 0.0 for x in p]
            c = max(range(world), key=lambda i: busy[i])
            imbalance = busy[c] - sum(wi * b for wi, b in zip(w, busy, strict=True))
            exposed = p[c]["comm_s"] or 0.0
            sums["input_wait"] += k * sum(wi * d for wi, d in zip(w, D, strict=True))
            sums["work"] += k * sum(wi * (ci + oi) for wi, ci, oi in zip(w, C, O, strict=True))
            if split is not None:
                sums["overlap"] += k * sum(
                    wi * (ci - s[0]) for wi, ci, s in zip(w, C, split, strict=True)
                )
                sums["optimizer"] += k * sum(
                    wi * (oi - s[1]) for wi, oi, s in zip(w, O, split, strict=True)
                )
        else:  # plain DDP: the rank slowest alone sets the step
            c = ddp_c
            work = (p[c]["step_s"] or iv.wall_per_step_s) - D[c]
            sums["input_wait"] += k * D[c]
            sums["work"] += k * work
            imbalance = 0.0  # from the solo steps, below
            if split is not None:
                exposed = work - O[c] - split[c][0]
                sums["optimizer"] += k * (O[c] - split[c][1])
            else:  # the solo step whole (optimizer included), or nothing to set against
                exposed = work - (solos[c].step_s if solos else 0.0)
        sums["imbalance"] += k * imbalance
        sums["exposed_comm"] += k * exposed
        on["imbalance"][c] += k * imbalance
        on["exposed_comm"][c] += k * exposed
        critical[c] += k
        outside = iv.wall_per_step_s - (p[c]["step_s"] or 0.0)  # ≥ 0: phases are fitted
        sums["boundary"] += k * min(outside, boundary_s)
        sums[excess] += k * max(outside - boundary_s, 0.0)
    work = sums.pop("work") / n
    raw: dict[str, float | None] = {t: v / n for t, v in sums.items()}
    ref = sum(ivs[-1].plan) / ideal if solos else work
    # What cannot be measured here is n/a (None), not 0.
    if not solos or split is None:
        raw["optimizer"] = None  # no solo optimizer time to set the job's against
    if busy_method and not solos:
        raw["overlap"] = None
    elif busy_method and split is None:  # older runs: compute and optimizer together
        raw["overlap"] = work - ref
    if not busy_method:  # plain DDP: compute and the wait for peers are one phase
        raw["overlap"] = None
        raw["imbalance"] = solos[ddp_c].step_s - ref if solos else None
        if not solos:
            raw["exposed_comm"] = None
    return Parts(
        steps=n,
        step_s=sum(iv.wall_s for iv in ivs) / n,
        reference_s=ref,
        raw=raw,
        critical=max(range(world), key=lambda i: critical[i]),
        term_ranks={t: max(range(world), key=lambda i: v[i]) for t, v in on.items()}
        if busy_method
        else dict.fromkeys(on, ddp_c),
        ranks=ranks,
    )


def _solo_split(solos: Sequence[Solo]) -> list[tuple[float, float]] | None:
    """Each rank's solo compute and optimizer, scaled to add up to its solo step (the
    medians of two phases do not add up to the median step), or ``None`` unmeasured."""
    out = []
    for s in solos:
        if s.compute_s is None or s.optimizer_s is None or s.compute_s + s.optimizer_s <= 0:
            return None
        k = s.step_s / (s.compute_s + s.optimizer_s)
        out.append((k * s.compute_s, k * s.optimizer_s))
    return out


def settle(raw: dict[str, float | None], pair: tuple[str, str]) -> None:
    """The job-against-alone pair (each of either sign) as two terms ≥ 0 of the same sum
    where it is ≥ 0: a phase faster in the job offsets the other. A negative sum (the
    job's own work faster than alone) leaves both 0; the caller's scale takes it off."""
    a, b = raw[pair[0]], raw[pair[1]]
    if a is None:
        return
    if b is None:
        raw[pair[0]] = max(a, 0.0)
        return
    total = a + b
    if total <= 0:
        raw[pair[0]] = raw[pair[1]] = 0.0
    elif a < 0:
        raw[pair[0]], raw[pair[1]] = 0.0, total
    elif b < 0:
        raw[pair[0]], raw[pair[1]] = total, 0.0
