"""The run view's model: a standalone run's files as the job-detail model, plus its
throughput, evaluations and gap breakdown.

A run's records (``hetero.trainer.metrics``) carry per rank what a coordinator
job's intervals do, so they become the same ``JobView`` and ``JobDetailView``
the job-detail screen draws, and its panels draw them unchanged. What a
coordinator adds (placement, stragglers, events) is absent or derived here:
nodes are the run's host, and plan changes are the events. The gap breakdown is
``hetero.core.verdict.diagnose`` over the records (what ``hetero-bench report``
computes from the same files); once ``summary.json`` exists it is the summary's
own, with the solo measurement behind the ideal. Pure and immutable: the
follower's thread builds it, the UI thread reads it.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetero.core.gap import intervals_from_records, solos_from_summary
from hetero.core.textsafe import printable
from hetero.core.verdict import diagnose
from hetero.tui.detail import EventView, JobDetailView, PlanView, phases
from hetero.tui.runfiles import Record, RunFiles
from hetero.tui.state import JobView, LiveView, RankStats, RankView

#: Seconds without a new record after which a run whose process cannot be checked
#: (another host, no run.json) is said to be quiet.
QUIET_AFTER_S = 60.0

Series = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class RunView:
    files: RunFiles
    #: "waiting" (no record yet), "running", "finished", "stopped" (its process is gone
    #: without closing), or "quiet" (no record for a while; the process cannot be checked).
    status: str
    detail: JobDetailView
    #: (end step, samples/s) per interval, the whole job's.
    throughput: Series
    #: Metric name -> (step, value) per evaluation, names in first-seen order.
    evals: tuple[tuple[str, Series], ...]
    #: The gap breakdown's stored form (``Breakdown.to_dict()``), None before a measured
    #: interval; ``gap_final`` when it is the finished run's summary's.
    gap: dict[str, Any] | None
    gap_final: bool
    emulated: bool
    emulated_slowdown: str | None
    #: When the view was built (Unix seconds): ages are drawn against it.
    now_unix_s: float = 0.0

    @property
    def job(self) -> JobView:
        return self.detail.job


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _aligned(ranks: Sequence[Sequence[Record]]) -> list[tuple[int, list[Record | None]]]:
    """Per end step of rank 0's records, every rank's record of that step (None if absent)."""
    if not ranks:
        return []
    by_step = [{int(r.get("step", -1)): r for r in recs} for recs in ranks]
    steps = [int(r0.get("step", -1)) for r0 in ranks[0]]
    return [(step, [m.get(step) for m in by_step]) for step in steps]


def rank_stats(rank: int, r: Record) -> RankStats:
    phases_s = r.get("phases_s") or {}
    peak = r.get("peak_memory_bytes")
    return RankStats(
        rank=rank,
        batch=int(r.get("batch") or 0),
        steps=int(r.get("steps_measured") or 0),
        compute_s=_num(r.get("compute_s")) or 0.0,
        step_s=_num(r.get("step_s")) or 0.0,
        data_s=_num(phases_s.get("data")),
        forward_s=_num(phases_s.get("forward")),
        backward_s=_num(phases_s.get("backward")),
        comm_wait_s=_num(phases_s.get("comm")),
        optimizer_s=_num(phases_s.get("optimizer")),
        peak_memory_bytes=int(peak) if isinstance(peak, int) else None,
    )


def status_of(files: RunFiles, now_unix_s: float) -> str:
    if files.finished:
        return "finished"
    if not files.intervals:
        return "waiting"
    info = files.info or {}
    pid, host = info.get("pid"), info.get("host")
    if isinstance(pid, int) and host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "stopped"
        except PermissionError:
            pass  # another user's process: it exists
        return "running"
    return "quiet" if now_unix_s - files.updated_unix_s > QUIET_AFTER_S else "running"


def run_view(files: RunFiles, now_unix_s: float) -> RunView:
    """The view of ``files`` at ``now_unix_s`` (Unix seconds)."""
    info, summary = files.info or {}, files.summary or {}
    rows = _aligned(files.ranks)
    world = len(files.ranks)
    steps: list[int] = []
    batches: list[list[int]] = [[] for _ in range(world)]
    per_sample: list[list[float]] = [[] for _ in range(world)]
    loss: list[tuple[int, float]] = []
    throughput: list[tuple[int, float]] = []
    events: list[EventView] = []
    plans: list[PlanView] = []
    for step, recs in rows:
        r0 = recs[0]
        assert r0 is not None  # rows come from rank 0's records
        steps.append(step)
        for rank, r in enumerate(recs):
            batch = int(r.get("batch") or 0) if r else 0
            compute = _num(r.get("compute_s")) if r else None
            batches[rank].append(batch)
            ok = batch > 0 and compute is not None and bool(r and r.get("steps_measured"))
            per_sample[rank].append(compute / batch if ok and compute is not None else math.nan)
        if (v := _num(r0.get("loss"))) is not None:
            loss.append((step, v))
        if (v := _num(r0.get("samples_per_s"))) is not None:
            throughput.append((step, v))
        if not plans and isinstance(r0.get("plan"), list):
            plans.append(PlanView(0, 0, tuple(r0["plan"]), "initial"))
        if r0.get("plan_changed") and isinstance(r0.get("next_plan"), list):
            at = int(r0.get("apply_at_step") or step)
            plan = PlanView(
                len(plans), at, tuple(r0["next_plan"]), printable(str(r0.get("reason") or ""))
            )
            plans.append(plan)
            what = f"v{plan.version} {list(plan.batches)} from step {plan.apply_at_step}"
            events.append(
                EventView(_num(r0.get("time_s")) or 0.0, "plan", f"{what}: {plan.reason}")
            )
    last = [r for r in rows[-1][1]] if rows else []
    slowdowns = [(_num(r.get("slowdown")) or 1.0) if r else 1.0 for r in last] or [1.0] * world
    emulated = bool(info.get("emulated") or summary.get("emulated")) or any(
        bool(r and r.get("emulated")) for r in last
    )
    gap, final = _gap(files)
    job = _job(files, rows, slowdowns, emulated, status_of(files, now_unix_s), len(plans), gap)
    return RunView(
        files=files,
        status=job.state,
        detail=JobDetailView(
            job=job,
            steps=tuple(steps),
            batches=tuple(tuple(b) for b in batches),
            per_sample_s=tuple(tuple(p) for p in per_sample),
            loss=tuple(loss),
            breakdown=tuple(phases(rank_stats(i, r)) for i, r in enumerate(last) if r),
            plans=tuple(plans),
            events=tuple(events),
        ),
        throughput=tuple(throughput),
        evals=_evals(files.evals),
        gap=gap,
        gap_final=final,
        emulated=emulated,
        emulated_slowdown=info.get("emulated_slowdown") or summary.get("emulated_slowdown"),
        now_unix_s=now_unix_s,
    )


def _job(
    files: RunFiles,
    rows: list[tuple[int, list[Record | None]]],
    slowdowns: list[float],
    emulated: bool,
    status: str,
    plan_count: int,
    gap: dict[str, Any] | None,
) -> JobView:
    info, summary = files.info or {}, files.summary or {}
    last = rows[-1][1] if rows else []
    r0 = last[0] if last else None
    plan = list(r0.get("next_plan") or r0.get("plan") or []) if r0 else []
    device = printable(str(info.get("device") or summary.get("device") or "?"))
    live = None
    if r0 is not None:
        ideal = _num(summary.get("ideal_samples_per_s")) or (
            _num(gap.get("ideal_samples_per_s")) if gap else None
        )
        live = LiveView(
            end_step=int(r0.get("step", 0)),
            plan_version=max(plan_count - 1, 0),
            samples_per_s=_num(r0.get("samples_per_s")),
            equal_samples_per_s=None,
            ideal_samples_per_s=ideal,
            loss=_num(r0.get("loss")),
            emulated=emulated,
            ranks=tuple(rank_stats(i, r) for i, r in enumerate(last) if r),
            stragglers=(),
        )
    total = info.get("total_steps") or (summary.get("steps") if summary else None)
    return JobView(
        id=files.path.name,
        name=printable(str(summary.get("name") or files.path.name)),
        state=status,
        policy=str(info.get("policy") or summary.get("policy") or "?"),
        global_batch=int(info.get("global_batch") or summary.get("global_batch") or sum(plan)),
        world_size=len(files.ranks),
        backend=str(info.get("backend") or summary.get("backend") or "?"),
        last_step=int(r0.get("step", 0)) if r0 else 0,
        total_steps=int(total) if isinstance(total, int) else None,
        restarts=0,
        message=str(gap.get("verdict") or "") if gap else "",
        plan_version=max(plan_count - 1, 0),
        ranks=tuple(
            RankView(
                rank=i,
                node_id=device,
                node_name=device,
                device_index=i,
                device_name=device,
                state=status,
                emulated_slowdown=slowdowns[i] if i < len(slowdowns) else 1.0,
                batch=plan[i] if i < len(plan) else None,
            )
            for i in range(len(files.ranks))
        ),
        live=live,
    )


def _gap(files: RunFiles) -> tuple[dict[str, Any] | None, bool]:
    """The summary's breakdown once the run finished (recomputed from the records with
    its solo times where an older hetero stored it), else the records' (no solo times)."""
    summary = files.summary or {}
    # A breakdown stored before its terms added up (no ``adds_up``) is recomputed.
    if isinstance(summary.get("gap"), dict) and "adds_up" in summary["gap"]:
        return dict(summary["gap"]), True
    intervals = intervals_from_records(files.ranks) if files.intervals else []
    solos = solos_from_summary(files.summary)
    bd = diagnose(intervals, solos) if intervals else None
    return (bd.to_dict() if bd is not None else None), solos is not None


def _evals(records: Sequence[Record]) -> tuple[tuple[str, Series], ...]:
    series: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        metrics = rec.get("metrics")
        if not isinstance(metrics, dict):
            continue
        for name, value in metrics.items():
            if (v := _num(value)) is not None and math.isfinite(v):
                series.setdefault(str(name), []).append((int(rec.get("step", 0)), v))
    return tuple((name, tuple(points)) for name, points in series.items())
