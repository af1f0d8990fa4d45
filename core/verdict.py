"""What a gap breakdown says, in words: each term's detail, a one-line verdict, a table.

``diagnose`` is the call the trainer and the bench report make: the arithmetic of
``hetero.core.gap`` plus the words. The verdict names the largest term first, then
where it sits and what fixes it: "input wait: 21.0 ms/step (18% of ideal), most on
rank 0 (23% of its step waits for data): add loader workers, ...". ``lines`` renders
the stored form (``Breakdown.to_dict()``, as in a summary or results.json) as plain
text: no rich, so it prints on a GPU host that lacks it. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hetero.core.gap import LABELS, TERMS, Breakdown, IntervalTimes, RankGap, Solo, Term, breakdown

#: At or above this % of ideal the verdict says there is nothing large left.
GOOD_PCT = 97.0

_ADVICE = {
    "input_wait": "add loader workers, or make each sample cheaper to load",
    "exposed_comm": "the gradient all-reduce ends after the busiest rank is done, or that rank "
    "waits for a peer's slow step",
    "overlap": "the gradient all-reduce running beside backward slows it",
    # Measured alone, a rank steps its optimizer on the device; under --offload params the
    # job steps it on the host.
    "optimizer": "the optimizer step takes longer in the job than alone (other work beside "
    "it, or on the host under --offload params)",
    "plan_changes": "each new batch size costs its first steps (allocator growth, kernel "
    "selection) and, on the DataLoader path, a restart of the loader's workers when their "
    "count moves",
    "boundary": "the rebalance exchange at each boundary; a longer rebalance interval "
    "spreads it over more steps",
    "pauses": "time between steps the trainer does not time (evaluation, checkpoints)",
}
_PHASES = (("data", "input wait"), ("compute", "compute"), ("optimizer", "the optimizer step"))


def diagnose(
    intervals: Sequence[IntervalTimes],
    solos: Sequence[Solo] | None = None,
    *,
    window: range | None = None,
    steady_samples_per_s: float | None = None,
) -> Breakdown | None:
    """The gap breakdown over ``window`` with each term's detail and the verdict."""
    bd = breakdown(intervals, solos, window=window, steady_samples_per_s=steady_samples_per_s)
    return explain(bd) if bd is not None else None


def explain(bd: Breakdown) -> Breakdown:
    out = replace(bd, terms=tuple(_detail(t, bd) for t in bd.terms))
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


def _slowdown(r: RankGap) -> float | None:
    if r.compute_ms is None or r.solo_compute_ms is None:
        return None
    return r.compute_ms - r.solo_compute_ms


def _detail(t: Term, bd: Breakdown) -> Term:
    ranks = bd.ranks
    c = t.rank if t.rank is not None else bd.critical_rank
    if t.ms_per_step is None:
        return t
    if t.name == "imbalance" and c is not None:
        if bd.method == "solo":
            return replace(t, rank=c, detail=f"rank {c} alone is the slowest at its batch")
        phase = _heaviest_phase(bd, c)
        mostly = f", mostly {phase}" if phase else ""
        return replace(t, rank=c, detail=f"rank {c} busy {_f(ranks[c].busy_ms)} ms/step{mostly}")
    if t.name == "input_wait":
        r = _top(ranks, lambda g: g.data_ms)
        if r is not None:
            share = (r.data_ms or 0.0) / bd.step_ms if bd.step_ms else 0.0
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
    if t.name == "exposed_comm" and c is not None:
        if bd.method == "solo":
            return replace(t, rank=c, detail=f"rank {c}, includes overlap (plain DDP)")
        return replace(
            t, rank=c, detail=f"the busiest rank's wait for the all-reduce; most on rank {c}"
        )
    if t.name == "plan_changes":
        n = bd.plan_changes
        if not n:
            return replace(t, detail="no new plan in the window")
        each = t.ms_per_step * bd.steps / n / 1e3
        return replace(t, detail=f"{n} new plan{'' if n == 1 else 's'}, ~{each:.2f} s each")
    return t


def verdict(bd: Breakdown) -> str:
    """One line that names the largest term (and its rank), what it costs, what fixes it."""
    if not bd.adds_up:
        return "the breakdown does not add up: see the notes"
    if bd.largest is None:
        return (
            f"at or above the ideal ({_f(bd.pct_of_ideal)}%): nothing to break down"
            if bd.ideal_samples_per_s
            else "no gap to the ranks' own work: nothing to break down"
        )
    top = bd.term(bd.largest)
    x, share = top.ms_per_step or 0.0, top.pct or 0.0
    what = "of ideal" if bd.ideal_samples_per_s else "of the step"
    cost = f"{LABELS[top.name]}: {x:.1f} ms/step ({share:.0f}% {what})"
    pct = bd.pct_of_ideal
    if pct is not None and pct >= GOOD_PCT:
        return f"{pct:.1f}% of ideal, nothing large left to win; the largest term is {cost}"
    where = _where(top, bd)
    if top.name == "input_wait" and top.rank is not None and _keeps_up(bd, top.rank):
        return f"{cost}, {where}: the waits are stalls, not the loader's pace (workers starting)"
    if top.name == "imbalance" and bd.method == "solo":
        return f"{cost}, {where}: batches sized to measured speed recover it"
    if top.name in ("imbalance", "exposed_comm") and bd.method != "solo":
        # A rank whose loader caps its share shows as imbalance (the others carry more
        # than their speed says) or as the busiest rank waiting for it at the all-reduce.
        capped = _input_capped(bd, top.rank)
        if capped is not None:
            me = bd.ranks[capped]
            return (
                f"input-bound on rank {capped}: its loader makes a batch of {me.batch} in "
                f"{me.input_ms or 0.0:.1f} ms of a {bd.step_ms:.1f} ms step, which caps its "
                f"share ({cost}): add loader workers on rank {capped}"
            )
    if top.name == "imbalance":
        return f"{cost}, {where}: the plan does not balance busy time"
    return f"{cost}{', ' + where if where else ''}: {_ADVICE[top.name]}"


#: A rank whose loader needs this share of the step for its batch cannot take much more:
#: the imbalance beside it is its input's, not the plan's.
INPUT_CAP_SHARE = 0.6


def _input_capped(bd: Breakdown, busiest: int | None) -> int | None:
    """A rank other than the busiest whose loader's time per batch (``input_s``) is at
    least ``INPUT_CAP_SHARE`` of the step: the plan cannot give it more; None if none."""
    if busiest is None or not bd.step_ms:
        return None
    near = [
        r
        for r in bd.ranks
        if r.rank != busiest
        and r.input_ms is not None
        and r.input_ms >= INPUT_CAP_SHARE * bd.step_ms
    ]
    return max(near, key=lambda r: r.input_ms or 0.0).rank if near else None


def _keeps_up(bd: Breakdown, r: int) -> bool:
    """Whether rank ``r``'s loader makes a batch faster than a step needs one (known only
    where the records carry ``input_s``)."""
    me = bd.ranks[r]
    return me.input_ms is not None and me.input_ms < bd.step_ms - (me.data_ms or 0.0)


def _loader_pace(bd: Breakdown, r: int) -> str:
    me = bd.ranks[r]
    if me.input_ms is None:
        return ""
    rest = bd.step_ms - (me.data_ms or 0.0)
    verb = "keep up" if _keeps_up(bd, r) else "fall behind"
    return (
        f"its workers {verb}: {me.input_ms:.1f} ms a batch, {rest:.1f} ms a step without the wait"
    )


def _where(t: Term, bd: Breakdown) -> str:
    """Where the term sits, for the verdict."""
    r = t.rank
    if t.name == "imbalance" and r is not None:
        if bd.method == "solo":
            return f"equal batches leave rank {r} the slowest"
        phase = _heaviest_phase(bd, r)
        return f"rank {r} is the busiest" + (f", mostly {phase}" if phase else "")
    if t.name == "input_wait" and r is not None:
        me = bd.ranks[r]
        waits = (me.data_ms or 0.0) / bd.step_ms if bd.step_ms else 0.0
        where = f"most on rank {r} ({waits:.0%} of its step waits for data)"
        pace = _loader_pace(bd, r)
        return f"{where}; {pace}" if pace else where
    if t.name == "overlap" and r is not None:
        return f"rank {r} computes {_slowdown(bd.ranks[r]) or 0.0:.1f} ms/step slower than alone"
    if t.name == "exposed_comm" and r is not None:
        return f"on rank {r}, the busiest"
    if t.name == "plan_changes":
        return t.detail
    return ""


# -- text -------------------------------------------------------------------------------


def lines(gap: Mapping[str, Any]) -> list[str]:
    """The breakdown (its stored dict form) as plain-text lines: header, terms, ranks,
    the whole run, verdict. A stored form from before the terms added up (it has no
    ``adds_up``) is not shown: its terms could be negative."""
    if "adds_up" not in gap:
        return ["gap to ideal: stored by an older hetero; `hetero-bench report` recomputes it"]
    ideal = gap.get("ideal_samples_per_s")
    n = gap["intervals"]
    span = f"steps {gap['first_step']}-{gap['last_step']} ({n} interval{'' if n == 1 else 's'})"
    head = f"gap to ideal, {span}: "
    if ideal:
        head += (
            f"{gap['achieved_samples_per_s']:,.0f} of {ideal:,.0f} samples/s "
            f"({gap['pct_of_ideal']:.1f}%); step {gap['step_ms']:.1f} ms, "
            f"ideal step {gap['reference_ms']:.1f} ms"
        )
    else:
        head += (
            f"{gap['achieved_samples_per_s']:,.0f} samples/s; step {gap['step_ms']:.1f} ms, "
            f"the ranks' own work {gap['reference_ms']:.1f} ms, ideal n/a"
        )
    out = [head]
    median = gap.get("median_samples_per_s")
    if median and abs(median / gap["achieved_samples_per_s"] - 1) > 0.01:
        out.append(
            f"  (over the window's wall time; the steady figure, a median interval, is "
            f"{median:,.0f})"
        )
    if not gap["adds_up"]:
        out += [f"  note: {x}" for x in gap.get("notes") or ()]
        out.append("  the breakdown does not add up: its terms are not shown")
        out.append(f"verdict: {gap['verdict']}")
        return out
    share = "% of ideal" if ideal else "% of step"
    out.append(f"  {'':<22} {'ms/step':>8} {share:>10} {'samples/s':>10}  where")
    for name in TERMS:
        t = gap["terms"][name]
        out.append(
            f"  {LABELS[name]:<22} {_f(t['ms_per_step']):>8} {_f(t['pct'], '{:.1f}%'):>10} "
            f"{_f(t['samples_per_s'], '{:,.0f}'):>10}  {t.get('detail') or ''}".rstrip()
        )
    total = sum(t["ms_per_step"] or 0.0 for t in gap["terms"].values())
    gap_pct = 100.0 * total / gap["step_ms"] if gap["step_ms"] else 0.0
    out.append(
        f"  {'= the gap':<22} {total:>8.1f} {gap_pct:>9.1f}%"
        f"{'':>11}  step {gap['step_ms']:.1f} − {gap['reference_ms']:.1f} ms"
    )
    out.append("  rank  batch   data  compute (alone)  optimizer (alone)   busy   wait   [ms/step]")
    for r in gap["ranks"]:
        out.append(
            f"  {r['rank']:>4} {r['batch']:>6} {_f(r['data_ms']):>6} "
            f"{_f(r['compute_ms']):>8} ({_f(r['solo_compute_ms']):>5}) "
            f"{_f(r['optimizer_ms']):>9} ({_f(r['solo_optimizer_ms']):>5}) "
            f"{_f(r['busy_ms']):>6} {_f(r['wait_ms']):>6}"
        )
    out += [f"  note: {x}" for x in gap.get("notes") or ()]
    if gap.get("whole_run"):
        out += whole_run_lines(gap["whole_run"])
    out.append(f"verdict: {gap['verdict']}")
    return out


def whole_run_lines(w: Mapping[str, Any]) -> list[str]:
    """The whole run against the steady figure, and what plan changes took of it."""
    out = [
        f"whole run, steps {w['first_step']}-{w['last_step']}: {w['samples_per_s']:,.0f} "
        f"samples/s in {w['wall_s']:.1f} s (steady {w['steady_samples_per_s']:,.0f})"
    ]
    n = w["plan_changes"]
    pct = 100.0 * w["plan_change_s"] / w["wall_s"] if w["wall_s"] else 0.0
    them = "1 interval" if n == 1 else f"{n} intervals"
    if n and pct >= 0.5:
        out.append(
            f"  plan changes cost {pct:.0f}% of the run: {them} with a new plan took "
            f"{w['plan_change_s']:.1f} s beyond the steady pace (~{w['plan_change_s'] / n:.2f} s "
            "each)"
        )
    elif n:
        out.append(f"  plan changes cost under 1% of the run ({them} with a new plan)")
    slow = 100.0 * w["slow_s"] / w["wall_s"] if w["wall_s"] else 0.0
    if slow >= 2.0:
        out.append(
            f"  {w['slow_intervals']} intervals that kept their plan ran {w['slow_s']:.1f} s "
            f"({slow:.0f}%) beyond its median pace (epoch starts, evaluation, checkpoints)"
        )
    return out
