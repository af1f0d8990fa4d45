"""A run's summary through the API: throughput, plans, the ideal and where the gap went.

``ctx.report()`` returns it on every rank (every rank holds every rank's interval
summaries) and prints it on rank 0; ``hetero-train`` adds the same ``solo`` and
``gap`` fields to its own summary (:func:`gap_fields`). The breakdown's
arithmetic and words are ``hetero.core.gap`` and ``hetero.core.verdict``, the
ones ``hetero-bench report`` recomputes from the metrics files.

Figures: ``steady_samples_per_s`` is the median interval throughput over the
latter half of the intervals, ``throughput_samples_per_s`` all samples over all
wall time after the first interval, ``ideal_samples_per_s`` the sum of the solo
rates (``ctx.measure_ideal``; ``None`` if it was not run).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, TextIO

from hetero.core.gap import IntervalTimes, RankTimes, Solo
from hetero.core.verdict import diagnose, lines

if TYPE_CHECKING:
    from hetero.trainer.context import Context


def intervals_of(ctx: Context, last: int | None = None) -> list[IntervalTimes]:
    """The context's intervals (``ctx.summaries`` and their wall times) for the breakdown;
    the ``last`` ones only if given."""
    loader = ctx._require_loader()
    global_batch = loader.sampler.global_batch
    out: list[IntervalTimes] = []
    summaries = ctx.summaries[-last:] if last else ctx.summaries
    walls = ctx.interval_walls[-last:] if last else ctx.interval_walls
    counts = [max(round(sum(r.samples for r in iv) / global_batch), 1) for iv in summaries]
    step = ctx.global_step - sum(counts)
    for iv, wall, n in zip(summaries, walls, counts, strict=True):
        step += n
        measured = all(r.steps > 0 for r in iv)
        ranks = tuple(
            replace(
                RankTimes.of_phases(
                    r.batch, r.data_s, r.forward_s, r.backward_s, r.comm_s, r.optimizer_s
                ),
                input_s=r.input_s,
            )
            if measured
            else RankTimes(r.batch)
            for r in iv
        )
        if wall > 0:
            out.append(IntervalTimes(step, n, wall, ranks, measured))
    return out


def rates(ctx: Context) -> tuple[float, float]:
    """(steady, whole run) samples/s: median of the latter half of the intervals, and all
    samples over all wall time after the first interval."""
    per: list[float] = []
    samples = wall_sum = 0.0
    for k, (iv, wall) in enumerate(zip(ctx.summaries, ctx.interval_walls, strict=True)):
        n = sum(r.samples for r in iv)
        if wall > 0:
            per.append(n / wall)
        if k > 0:
            samples += n
            wall_sum += wall
    window = per[len(per) // 2 :]
    steady = statistics.median(window) if window else 0.0
    return steady, samples / wall_sum if wall_sum > 0 else steady


def unmeasured(ctx: Context) -> str:
    """Why a run has no throughput: it is measured over whole rebalance intervals."""
    every = ctx.config.rebalance_interval
    return (
        f"not measured: {ctx.global_step} steps ran, throughput is timed over whole "
        f"rebalance intervals of {every} steps (run more steps, or lower --rebalance-interval)"
    )


def gap_fields(
    ctx: Context, solos: Sequence[Solo] | None, steady_samples_per_s: float
) -> dict[str, Any]:
    """``solo`` (each rank alone, seconds) and ``gap`` (the breakdown's stored form)."""
    usable = list(solos) if solos and all(s.samples_per_s > 0 for s in solos) else None
    bd = diagnose(intervals_of(ctx), usable, steady_samples_per_s=steady_samples_per_s or None)
    return {
        "solo": [asdict(s) for s in solos] if solos else None,
        "gap": bd.to_dict() if bd is not None else None,
    }


def api_summary(ctx: Context) -> dict[str, Any]:
    """The summary ``ctx.report()`` returns."""
    loader = ctx._require_loader()
    steady, overall = rates(ctx)
    solos = ctx.solo
    standalone = [s.samples_per_s for s in solos] if solos else []
    ideal = sum(standalone) if standalone and all(r > 0 for r in standalone) else None
    summary: dict[str, Any] = {
        "policy": ctx.config.policy,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "global_batch": loader.sampler.global_batch,
        "steps": ctx.global_step,
        "rebalance_interval": ctx.config.rebalance_interval,
        "steady_samples_per_s": steady,
        "throughput_samples_per_s": overall,
        "final_plan": list(ctx.plan),
        "plan_changes": len(ctx.plans) - 1,
        "plans": [asdict(p) | {"batches": list(p.batches)} for p in ctx.plans],
        # Rank 0's: why balancing did not beat equal batches at the end ("" if it did).
        "not_helping": ctx.not_helping,
        "per_rank_compute_s": [r.compute_s for r in ctx.summaries[-1]] if ctx.summaries else [],
        "standalone_samples_per_s": standalone,
        "ideal_samples_per_s": ideal,
        "ideal_method": "sum over ranks of each rank alone at its final planned batch, the batch "
        "on the device (ctx.measure_ideal)"
        if solos
        else "not measured (call ctx.measure_ideal before ctx.report)",
        "pct_of_ideal": 100.0 * steady / ideal if ideal and ctx.summaries else None,
        "throughput_note": None if ctx.summaries else unmeasured(ctx),
        "emulated": ctx.emulated,
        "recompute": ctx.recompute.as_dict(),
    }
    return summary | gap_fields(ctx, solos, steady)


def print_report(summary: dict[str, Any], file: TextIO | None = None) -> None:
    """The summary as plain text (no rich: it prints wherever torch runs)."""
    out = file or sys.stdout
    pct = summary.get("pct_of_ideal")
    ideal = summary.get("ideal_samples_per_s")
    emu = " (EMULATED slowdown)" if summary.get("emulated") else ""
    note = summary.get("throughput_note")
    throughput = (
        f"throughput {note}"
        if note
        else f"throughput {summary['steady_samples_per_s']:,.1f} samples/s steady, "
        f"{summary['throughput_samples_per_s']:,.1f} whole run"
    )
    if ideal and pct is not None:
        ideal_text = f"ideal {ideal:,.1f} ({pct:.1f}%)"
    elif ideal:
        ideal_text = f"ideal {ideal:,.1f}"
    else:
        ideal_text = "ideal not measured (ctx.measure_ideal)"
    print(
        f"hetero: {summary['policy']}, {summary['world_size']} ranks, global batch "
        f"{summary['global_batch']}, {summary['steps']} steps{emu}\n"
        f"  {throughput}; {ideal_text}; final plan {summary['final_plan']}, "
        f"{summary['plan_changes']} plan changes",
        file=out,
    )
    if summary.get("not_helping"):
        print(f"  hetero is not helping here: {summary['not_helping']}", file=out)
    if any(summary.get("recompute", {}).get("ranks", [])):
        from hetero.trainer.activations import RecomputeChoice

        text = RecomputeChoice.from_dict(summary["recompute"]).text()
        print(f"  activation checkpointing: {text}", file=out)
    if summary.get("gap"):
        print("\n".join(lines(summary["gap"])), file=out, flush=True)
    else:
        print("gap to ideal: n/a (no interval measured)", file=out, flush=True)
