"""Does the planner say a rank should go? Exclusion forecasts from a run's own metrics.

For a GPU + CPU job the question is whether the CPU ranks help at all. hetero's
balancer can shrink a slow rank's batch to ``min_batch`` but never drops it
mid-run; its straggler module forecasts whether running *without* a rank
would raise throughput (``predict_exclusion``). Here that forecast is made
from the run's metrics exactly as the balancer would see them (fitted
per-rank step models, exposed communication time estimated from wall versus
compute), so the report can set the planner's verdict beside the measured
GPU-alone run. Pure: imports the balancer, never torch.
"""

from __future__ import annotations

from typing import Any

from hetero.core.balancer import (
    Constraints,
    Dynamic,
    ExclusionRule,
    RankInterval,
    all_reduce_s,
    estimate_comm_s,
    predict_exclusion,
    predict_step_s,
)
from hetero.core.errors import HeteroError


def history_from_metrics(ranks: list[list[dict[str, Any]]]) -> list[tuple[RankInterval, ...]]:
    """The balancer's history (oldest first) from per-rank metrics records aligned by step."""
    by_step = [{int(r["step"]): r for r in recs} for recs in ranks]
    steps = sorted(set.intersection(*(set(m) for m in by_step))) if by_step else []
    history = []
    for k in steps:
        recs = [m[k] for m in by_step]
        if any(not r.get("compute_s") or not r.get("steps_measured") for r in recs):
            continue
        history.append(
            tuple(
                RankInterval(
                    rank=rank,
                    batch=int(r["batch"]),
                    steps=int(r["steps_measured"]),
                    compute_s=float(r["compute_s"]),
                    step_s=float(r.get("step_s") or 0.0),
                    peak_memory_bytes=int(r.get("peak_memory_bytes") or 0) or None,
                )
                for rank, r in enumerate(recs)
            )
        )
    return history


def exclusion_forecasts(
    ranks: list[list[dict[str, Any]]],
    global_batch: int,
    candidates: list[int],
    min_batch: int = 1,
    kinds: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One forecast per candidate rank, then (for several) one without them all:
    predicted samples/s with and without, and the verdict. ``ranks`` lists the ranks
    left out (``rank`` the first); the last forecast of a GPU + CPU job is the GPU
    alone, which the report sets beside the measured ``gpu-only`` run. ``kinds`` (the
    device kind of each rank) lets a forecast say when the smaller job changes backend.
    ``coordinator_excludes`` says whether the coordinator's rule (``ExclusionRule``: a
    straggler, forecasts agreeing over 3 intervals) would leave that one rank out of a job
    that allows it."""
    history = history_from_metrics(ranks)
    if len(history) < 2:
        return []
    try:
        models = Dynamic().fit(history)
        comm_s = estimate_comm_s(history)
        constraints = Constraints(global_batch, len(models), min_batch, comm_s=comm_s)
        decision = ExclusionRule().measured(history, constraints, kinds)
        out = []
        groups = [[rank] for rank in candidates] + ([candidates] if len(candidates) > 1 else [])
        for group in groups:
            f = predict_exclusion(models, constraints, group, kinds=kinds)
            out.append(
                {
                    "rank": group[0],
                    "ranks": list(f.excluded),
                    "samples_per_s": f.samples_per_s,
                    "samples_per_s_without": f.samples_per_s_without,
                    "gain": f.gain,
                    "worthwhile": f.worthwhile,
                    "comm_s": comm_s,
                    "comm_s_without": all_reduce_s(comm_s, len(models), len(models) - len(group)),
                    "message": f.message,
                    "coordinator_excludes": decision is not None
                    and decision.excluded == f.excluded,
                }
            )
        return out
    except HeteroError as exc:
        return [{"rank": None, "message": f"no forecast: {exc}"}]


def predicted_rate(
    ranks: list[list[dict[str, Any]]], global_batch: int, plan: list[int], upto_step: int
) -> float | None:
    """The planner's predicted samples/s for ``plan``, from what it knew at ``upto_step``.

    The per-rank step models are fitted, as the dynamic policy fits them, on the
    intervals that ended at or before ``upto_step`` (so the prediction is made
    before the window it is compared with); the exposed communication time is
    estimated from the same intervals. ``None`` without enough compute-timed
    intervals (plain DDP reports none).
    """
    cut = [[r for r in recs if int(r["step"]) <= upto_step] for recs in ranks]
    history = history_from_metrics(cut)
    if len(history) < 2 or len(plan) != len(history[-1]):
        return None
    try:
        models = Dynamic().fit(history)
        step_s = predict_step_s(models, plan, comm_s=estimate_comm_s(history))
    except HeteroError:
        return None
    return global_batch / step_s if step_s > 0 else None
