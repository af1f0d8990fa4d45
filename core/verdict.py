"""What a gap breakdown says, in words: each term's detail, a one-line verdict, a table.

``diagnose`` is the call the trainer and the bench report make: the arithmetic of
``hetero.core.gap`` plus the words, so a user reads "input-bound on rank 0 (23% of
its step waits for data): add loader workers" instead of JSON lines. ``lines``
renders the stored form (``Breakdown.to_dict()``, as in a summary or
results.json) as plain text: no rich, so it prints on a GPU host that lacks it.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hetero.core.gap import LABELS, TERMS, Breakdown, IntervalTimes, RankGap, Solo, Term, breakdown

#: At or above this % of ideal the verdict says there is nothing large left.
GOOD_PCT = 97.0
#: A term below this share of the ideal (%) is not named as the cause.
MINOR_PCT = 1.0

_ADVICE = {
    "input_wait": "add loader workers, or make each sample cheaper to load",
    "exposed_comm": "the gradient all-reduce runs after the busiest rank is done",
    "overlap": "the gradient all-reduce running beside backward slows it",
    # Measured alone, a rank steps its optimizer on the device; under --offload params the
    # job steps it on the host.
    "optimizer": "the optimizer step takes longer in the job than alone (other work beside "
    "it, or on the host under --offload params)",
    "warmup": "each new batch size costs allocator growth and kernel selection once",
}
_PHASES = (("data", "input wait"), ("compute", "compute"), ("optimizer", "the optimizer step"))


def diagnose(
    intervals: Sequence[IntervalTimes],
    solos: Sequence[Solo] | None = None,
    *,
    window: range | None = None,
    achieved_samples_per_s: float | None = None,
) -> Breakdown | None:
    """The gap breakdown over ``window`` with each term's detail and the verdict."""
    bd = breakdown(intervals, solos, window=window, achieved_samples_per_s=achieved_samples_per_s)
    return explain(bd) if bd is not None else None


def explain(bd: Breakdown) -> Breakdown:
    terms = tuple(_detail(t, bd) for t in bd.terms)
    residual = replace(
        bd.residual, detail="boundary exchanges, timing noise, the median interval vs the mean"
    )
    out = replace(bd, terms=terms, residual=residual)
    return replace(out, verdict=verdict(out))


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _top(ranks: Sequence[RankGap], key: Any) -> RankGap | None:
    known = [r for r in ranks if key(r) is not None]
    return max(known, key=key) if known else None


def _heaviest_phase(bd: Breakdown, c: int) -> str | None:
    """The phase in which the critical rank exceeds the ranks' mean the most."""
    best, label = 0.0, None
    for attr, name in _PHASES:
        vals = [getattr(r, f"{attr}_ms") for r in bd.ranks]
        if any(v is None for v in vals):
            continue
        excess = vals[c] - sum(vals) / len(vals)
        if excess > best:
            best, label = excess, name
    return label


def _detail(t: Term, bd: Breakdown) -> Term:
    c = bd.critical_rank
    ranks = bd.ranks
    if t.ms_per_step is None:
        return t
    if t.name == "imbalance" and c is not None:
        me = ranks[c]
        if bd.method == "solo":
            return replace(t, rank=c, detail=f"rank {c} alone is the slowest at its batch")
        phase = _heaviest_phase(bd, c)
        mostly = f", mostly {phase}" if phase else ""
        return replace(t, rank=c, detail=f"rank {c} busy {_f(me.busy_ms)} ms/step{mostly}")
    if t.name == "input_wait":
        r = _top(ranks, lambda g: g.data_ms)
        if r is not None:
            share = r.data_ms / bd.step_ms if r.data_ms is not None and bd.step_ms else 0.0
            return replace(
                t, rank=r.rank, detail=f"rank {r.rank} waits {_f(r.data_ms)} ms ({share:.0%})"
            )
    if t.name == "overlap":
        r = _top(ranks, _slowdown)
        if r is not None and r.solo_compute_ms is not None:
            return replace(
                t,
                rank=r.rank,
                detail=f"rank {r.rank} computes {_f(r.compute_ms)} ms vs "
                f"{_f(r.solo_compute_ms)} alone",
            )
    if t.name == "optimizer":
        per = " / ".join(_f(r.optimizer_ms) for r in ranks)
        alone = " / ".join(_f(r.solo_optimizer_ms) for r in ranks)
        return replace(t, detail=f"ranks {per} ms (alone {alone})")
    if t.name == "exposed_comm":
        step = f"step {bd.measured_step_ms:.1f} ms"
        if bd.method == "solo" and c is not None:
            return replace(t, rank=c, detail=f"{step}, includes overlap (plain DDP)")
        busiest = max((r.busy_ms for r in ranks if r.busy_ms is not None), default=None)
        return replace(t, rank=c, detail=f"{step}, busiest rank {_f(busiest)} ms")
    if t.name == "warmup" and not bd.plan_changes:
        return replace(t, detail="no plan change in the run")
    if t.name == "warmup":
        each_ms = bd.warmup_total_s / bd.plan_changes * 1e3
        changes = f"{bd.plan_changes} plan change{'' if bd.plan_changes == 1 else 's'}"
        return replace(t, detail=f"{changes} in the run, ~{each_ms:.0f} ms each")
    return t


def _slowdown(r: RankGap) -> float | None:
    if r.compute_ms is None or r.solo_compute_ms is None:
        return None
    return r.compute_ms - r.solo_compute_ms


def verdict(bd: Breakdown) -> str:
    """One line: what costs most and what to do, or that nothing large is left."""
    pct = bd.pct_of_ideal
    named = [t for t in bd.terms if t.ms_per_step is not None and t.pct is not None]
    top = max(named, key=lambda t: t.ms_per_step or 0.0) if named else None
    if pct is not None and pct >= GOOD_PCT:
        return f"{pct:.1f}% of ideal: nothing large left to win"
    if top is None or (top.pct or 0.0) < MINOR_PCT:
        return "no single cause stands out: " + (
            f"{pct:.1f}% of ideal" if pct is not None else "no solo measurement to compare"
        )
    x, share = top.ms_per_step or 0.0, top.pct or 0.0
    what = "of ideal" if bd.ideal_samples_per_s else "of the step"
    if top.name == "input_wait" and top.rank is not None:
        r = bd.ranks[top.rank]
        waits = (r.data_ms or 0.0) / bd.step_ms if bd.step_ms else 0.0
        return (
            f"input-bound on rank {top.rank} ({waits:.0%} of its step waits for data): "
            f"{_ADVICE['input_wait']}"
        )
    if top.name == "imbalance":
        if bd.method == "solo":
            return (
                f"imbalance: equal batches leave rank {top.rank} {x:.1f} ms/step slower than "
                f"the ideal step ({share:.0f}% {what}): batches sized to measured speed recover it"
            )
        phase = _heaviest_phase(bd, top.rank) if top.rank is not None else None
        mostly = f", mostly {phase}" if phase else ""
        return (
            f"imbalance: rank {top.rank} is busy {x:.1f} ms/step beyond the mean "
            f"({share:.0f}% {what}){mostly}: the plan does not balance busy time"
        )
    if top.name == "overlap" and top.rank is not None:
        r = bd.ranks[top.rank]
        d = _slowdown(r) or 0.0
        return (
            f"compute lost to overlap: rank {top.rank} computes {d:.1f} ms/step slower in the "
            f"job than alone ({share:.0f}% {what}): {_ADVICE['overlap']}"
        )
    label = {"exposed_comm": "communication exposed"}.get(top.name, LABELS[top.name])
    return f"{label}: {x:.1f} ms/step ({share:.0f}% {what}): {_ADVICE.get(top.name, '')}".rstrip(
        ": "
    )


# -- text -------------------------------------------------------------------------------


def lines(gap: Mapping[str, Any]) -> list[str]:
    """The breakdown (its stored dict form) as plain-text lines: header, terms, ranks, verdict."""
    ideal = gap.get("ideal_samples_per_s")
    n = gap["intervals"]
    span = f"steps {gap['first_step']}-{gap['last_step']} ({n} interval{'' if n == 1 else 's'})"
    head = f"gap to ideal, {span}: "
    if ideal:
        head += (
            f"{gap['achieved_samples_per_s']:,.0f} of {ideal:,.0f} samples/s "
            f"({gap['pct_of_ideal']:.1f}%); step {gap['step_ms']:.1f} ms, "
            f"ideal step {gap['ideal_step_ms']:.1f} ms"
        )
    else:
        head += f"{gap['achieved_samples_per_s']:,.0f} samples/s; step {gap['step_ms']:.1f} ms, ideal n/a"
    share = "% of ideal" if ideal else "% of step"
    out = [head, f"  {'':<22} {'ms/step':>8} {share:>10} {'samples/s':>10}  where"]
    terms = dict(gap["terms"])
    terms["residual"] = gap["residual"]
    for name in (*TERMS, "residual"):
        t = terms[name]
        out.append(
            f"  {LABELS[name]:<22} {_f(t['ms_per_step']):>8} {_f(t['pct'], '{:.1f}%'):>10} "
            f"{_f(t['samples_per_s'], '{:,.0f}'):>10}  {t.get('detail') or ''}".rstrip()
        )
    out.append("  rank  batch   data  compute (alone)  optimizer (alone)   busy   wait   [ms/step]")
    for r in gap["ranks"]:
        out.append(
            f"  {r['rank']:>4} {r['batch']:>6} {_f(r['data_ms']):>6} "
            f"{_f(r['compute_ms']):>8} ({_f(r['solo_compute_ms']):>5}) "
            f"{_f(r['optimizer_ms']):>9} ({_f(r['solo_optimizer_ms']):>5}) "
            f"{_f(r['busy_ms']):>6} {_f(r['wait_ms']):>6}"
        )
    out += [f"  note: {n}" for n in gap.get("notes") or ()]
    out.append(f"verdict: {gap['verdict']}")
    return out
