"""Rows of ``results.json`` / ``results.csv``, computed from what the runs left on disk.

Inputs per run directory ``runs/<name>/``: ``run.json`` (the harness's record),
``summary.json`` (the run's own summary, with the ideal), ``metrics/rank*.jsonl``
and ``gpu_util.jsonl``. ``build_rows`` recomputes every figure from those, so
``hetero-bench report`` after a change to a figure's definition rewrites the
numbers from the same raw data. Slightly over the usual ~450 lines: one row's figures,
each a few lines, read together; the gap terms and targets are modules of their own.

One row per run for a scenario without changes (``window = "steady"``); with
changes, one row per phase (``p0``, ``p1``, …) plus ``whole-run``. The ideal is
measured after training, in the run's final conditions, so ``pct_of_ideal``
and the gap breakdown (``gap``: ``hetero.core.verdict``, the same arithmetic as the
run's own summary, recomputed here from every rank's metrics) are given only for
the last phase. Rows carry the run's data path (``loader``/``jpeg``/``device``),
worker count and repeat; speedups compare runs of the same data path, worker
count and repeat (a pair of one repeat ran back to back). Every row also
carries the run's plan stability (plan changes per 20 intervals, each change's
cost in steps, why the plan held still) and, where it applies, whole-run over
steady throughput (a run without changes) or the intervals to settle after a
change (``figures``); ``harness.targets`` checks a scenario's targets on them.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.bench.harness import figures
from hetero.bench.harness.forecast import predicted_rate
from hetero.bench.harness.gpu_monitor import read_samples
from hetero.bench.harness.scenariospec import BASELINE, GPU_ONLY
from hetero.core.gap import TERMS, intervals_from_records, solos_from_summary
from hetero.core.verdict import diagnose

#: The gap breakdown's terms as CSV columns: % of ideal each cost (see docs/benchmarks.md).
GAP_COLUMNS = tuple(f"gap_{t}_pct" for t in TERMS)

CSV_COLUMNS = (
    "scenario",
    "model",
    "run",
    "policy",
    "data_path",
    "num_workers",
    "repeat",
    "runner",
    "window",
    "window_label",
    "samples_per_s",
    "whole_run_samples_per_s",
    "whole_vs_steady",
    "intervals",
    "plan_changes_per_20",
    "change_cost_steps",
    "change_costs_steps",
    "settle_intervals",
    "hold_reason",
    "ideal_samples_per_s",
    "pct_of_ideal",
    "speedup_vs_ddp",
    "speedup_vs_equal",
    "speedup_vs_gpu_only",
    "scaling_efficiency",
    "predicted_samples_per_s",
    "prediction_error",
    "imbalance",
    "adaptation_intervals",
    "adaptation_steps",
    "gpu_util_pct",
    "final_plan",
    "plan_changes",
    "global_batch",
    "steps",
    "amp",
    "device",
    "emulated",
    "ok",
    "date",
    "note",
    "peak_memory_gb",
    "predicted_peak_memory_gb",
    "memory_prediction_error",
    *GAP_COLUMNS,
    "gap_verdict",
)


@dataclass
class RunData:
    """Everything one run left on disk, loaded."""

    name: str
    outcome: dict[str, Any]
    summary: dict[str, Any] | None
    ranks: list[list[dict[str, Any]]]  # per rank, per interval
    util: list[tuple[float, list[float | None]]]

    @property
    def runner_is_ddp(self) -> bool:
        return bool(self.outcome.get("runner") == "torch-ddp")

    @property
    def policy(self) -> str:
        return str(self.outcome.get("policy") or self.name)

    @property
    def data_path(self) -> str:
        return str(self.outcome.get("data_path") or "device")

    @property
    def rank0(self) -> list[dict[str, Any]]:
        return self.ranks[0] if self.ranks else []

    @property
    def steps(self) -> list[int]:
        return [int(r["step"]) for r in self.rank0]

    @property
    def rates(self) -> list[float]:
        return [float(r["samples_per_s"]) for r in self.rank0]

    @property
    def walls(self) -> list[float]:
        return [float(r["interval_wall_s"]) for r in self.rank0]

    def compute_by_interval(self) -> list[list[float | None]]:
        """Per interval (rank 0's), each rank's compute-only seconds per step, or None."""
        by_step = [{int(r["step"]): r.get("compute_s") for r in rank} for rank in self.ranks]
        return [[m.get(k) for m in by_step] for k in self.steps]

    def batches_by_interval(self) -> list[list[int | None]]:
        by_step = [{int(r["step"]): r.get("batch") for r in rank} for rank in self.ranks]
        return [[m.get(k) for m in by_step] for k in self.steps]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut off by a killed run
    return out


def load_run(run_dir: Path) -> RunData:
    outcome = (
        json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    )
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    files = sorted(
        (run_dir / "metrics").glob("rank*.jsonl"), key=lambda p: int(p.stem.removeprefix("rank"))
    )
    ranks = [_read_jsonl(f) for f in files]
    return RunData(run_dir.name, outcome, summary, ranks, read_samples(run_dir / "gpu_util.jsonl"))


def run_changes(run: RunData, manifest: dict[str, Any]) -> list[tuple[int, str]]:
    """The run's changes: the neighbour switches it really made, or the emulated windows."""
    switches = [s for s in run.outcome.get("switches", []) if int(s["step"]) > 0]
    if switches:
        return [
            (int(s["step"]), "neighbour arrives" if s["on"] else "neighbour leaves")
            for s in switches
        ]
    return [(int(step), str(label)) for step, label in manifest.get("changes", [])]


def _window_span(run: RunData, window: range) -> tuple[float, float] | None:
    recs = [run.rank0[i] for i in window if i < len(run.rank0)]
    if not recs:
        return None
    return float(recs[0]["time_s"]) - float(recs[0]["interval_wall_s"]), float(recs[-1]["time_s"])


def _util(run: RunData, window: range) -> list[float | None] | None:
    span = _window_span(run, window)
    if span is None or not run.util:
        return None
    return figures.mean_utilization(run.util, *span) or None


def rows_for_run(run: RunData, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """This run's rows (speedups are filled in by :func:`build_rows`)."""
    sc = manifest["scenario"]
    s = run.summary or {}
    interval = int(sc["rebalance_interval"])
    base = (
        {
            "scenario": sc["name"],
            "model": sc["model"],
            "run": run.name,
            "policy": run.policy,
            "data_path": run.data_path,
            "num_workers": run.outcome.get("num_workers", s.get("num_workers")),
            "repeat": run.outcome.get("repeat"),
            "runner": run.outcome.get("runner", "hetero-train"),
            "final_plan": s.get("final_plan"),
            "plan_changes": max(len(s.get("plans", [])) - 1, 0) if s else None,
            "global_batch": sc["global_batch"],
            "world_size": s.get("world_size") or len(run.ranks) or None,
            "steps": s.get("steps"),
            "amp": sc["amp"],
            "device": manifest.get("device", "unknown"),
            "emulated": bool(sc.get("slowdowns") or sc.get("input_cost_ms")),
            "ok": run.outcome.get("returncode") == 0 and not run.outcome.get("error"),
            "date": manifest.get("date"),
            "note": run.outcome.get("error") or "",
        }
        | memory_columns(s, run.ranks)
        | stability_columns(run)
    )
    if run.policy == "equal" and len(set(s.get("final_plan") or [])) > 1:
        base["note"] = "; ".join(x for x in (base["note"], "equal split capped to fit memory") if x)
    rates = run.rates
    if not rates:
        return [
            base
            | {"window": "steady", "window_label": "no metrics", "samples_per_s": None}
            | dict.fromkeys(("ideal_samples_per_s", "pct_of_ideal", "imbalance"))
        ]
    phases = figures.phases(run.steps, run_changes(run, manifest), "start")
    compute = run.compute_by_interval()
    ideal = s.get("ideal_samples_per_s")
    standalone = s.get("standalone_samples_per_s") or []
    rows = []
    for k, ph in enumerate(phases):
        last = k == len(phases) - 1
        rate = figures.median_rate(rates, ph.steady)
        imb = figures.imbalance(compute, ph.steady)
        imb_note = ""
        if (
            imb is None
            and last
            and len(standalone) > 1
            and run.outcome.get("runner") == "torch-ddp"
        ):
            # Plain DDP has no compute-only time: use each rank's standalone step time at B/W.
            plan = s.get("final_plan") or []
            times = [b / r for b, r in zip(plan, standalone, strict=False) if r]
            imb = figures.interval_imbalance(times)
            imb_note = "imbalance from standalone step times"
        adapt = figures.adaptation_intervals(rates, ph) if k > 0 else None
        # The target's settling (issue 31): the first interval within 5%, no hold.
        settle = figures.adaptation_intervals(rates, ph, hold=1) if k > 0 else None
        whole = figures.whole_run_rate(rates, run.walls) if len(phases) == 1 else None
        predicted = None
        plan = s.get("final_plan") or []
        if last and not run.runner_is_ddp and len(ph.steady) and plan:
            # What the planner expected of the final plan, from the intervals before the
            # steady window (the ones it decided on).
            before = run.steps[ph.steady.start - 1] if ph.steady.start > 0 else 0
            predicted = predicted_rate(run.ranks, int(sc["global_batch"]), plan, before)
        rows.append(
            base
            | _gap_columns(run, ph.steady, rate if last else None)
            | {
                "window": "steady" if len(phases) == 1 else f"p{k}",
                "window_label": ph.label if len(phases) > 1 else "latter half of the run",
                "samples_per_s": rate,
                "ideal_samples_per_s": ideal if last else None,
                "pct_of_ideal": 100.0 * rate / ideal if (last and ideal and rate) else None,
                "imbalance": imb,
                "adaptation_intervals": adapt,
                "adaptation_steps": adapt * interval if adapt is not None else None,
                "settle_intervals": settle,
                "whole_run_samples_per_s": whole,
                "whole_vs_steady": whole / rate if (whole and rate) else None,
                "predicted_samples_per_s": predicted,
                "prediction_error": predicted / rate - 1.0 if (predicted and rate) else None,
                "gpu_util_pct": _util(run, ph.steady),
                "note": "; ".join(x for x in (base["note"], imb_note) if x),
            }
        )
    if len(phases) > 1:
        rows.append(
            base
            | {
                "window": "whole-run",
                "window_label": "all intervals but the first",
                "samples_per_s": figures.whole_run_rate(rates, run.walls),
                "ideal_samples_per_s": None,
                "pct_of_ideal": None,
                "imbalance": figures.imbalance(compute, range(1, len(rates))),
                "gpu_util_pct": _util(run, range(1, len(rates))),
            }
        )
    return rows


def stability_columns(run: RunData) -> dict[str, Any]:
    """How still the run's plan held: intervals, plan changes per 20 intervals, each
    change's cost in steps (and the largest), and why it held (``figures``)."""
    plans = (run.summary or {}).get("plans")
    changes = len(plans) - 1 if plans else sum(bool(r.get("plan_changed")) for r in run.rank0)
    costs = [round(c, 3) for _, c in figures.change_costs_steps(run.ranks)]
    return {
        "intervals": len(run.rank0),
        "plan_changes_per_20": figures.changes_per_intervals(changes, len(run.rank0)),
        "change_costs_steps": costs or None,
        "change_cost_steps": max(costs) if costs else None,
        "hold_reason": None if run.runner_is_ddp else figures.why_held(run.rank0),
    }


def memory_columns(summary: dict[str, Any], ranks: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-rank peak memory (GB) over the run, the peak the start-up probe's line
    predicts at the batch the rank ran then, and the largest relative error of that
    prediction over every interval of every rank; ``None`` where the run has no probe
    (CPU ranks) or no peaks."""
    probe = summary.get("memory_probe") or []
    if not probe or len(probe) != len(ranks):
        measured = [float(b) for b in summary.get("per_rank_peak_memory_bytes") or []]
        return {
            "peak_memory_gb": [round(m / 1e9, 3) for m in measured] or None,
            "predicted_peak_memory_gb": None,
            "memory_prediction_error": None,
        }

    def predict(p: dict[str, Any], batch: int) -> float:
        return (
            float(p["fixed_bytes"])
            + batch * float(p["per_sample_bytes"])
            + float(p["optimizer_bytes"])
        )

    peaks: list[float | None] = []
    predicted: list[float | None] = []
    errors: list[float] = []
    for p, recs in zip(probe, ranks, strict=True):
        tops = [float(r["peak_memory_bytes"]) for r in recs if r.get("peak_memory_bytes")]
        if p is None:  # a rank the probe skipped (a CPU rank of a mixed job)
            peaks.append(max(tops) if tops else None)
            predicted.append(None)
            continue
        pairs = [
            (float(r["peak_memory_bytes"]), predict(p, int(r["batch"])))
            for r in recs
            if r.get("peak_memory_bytes")
        ]
        if not pairs:
            return dict.fromkeys(
                ("peak_memory_gb", "predicted_peak_memory_gb", "memory_prediction_error")
            )
        top = max(pairs)
        peaks.append(top[0])
        predicted.append(top[1])
        errors += [abs(pr / m - 1.0) for m, pr in pairs]
    return {
        "peak_memory_gb": [None if m is None else round(m / 1e9, 3) for m in peaks],
        "predicted_peak_memory_gb": [None if q is None else round(q / 1e9, 3) for q in predicted],
        "memory_prediction_error": max(errors) if errors else None,
    }


def _gap_columns(run: RunData, window: range, rate: float | None) -> dict[str, Any]:
    """The gap breakdown of the window (the last phase's only: it needs the ideal).
    Its shares are of the window's wall time, so with the breakdown's own % of ideal
    (``gap.pct_of_ideal``, the window's samples over its wall time) they make 100;
    ``rate`` (the row's median interval) is the steady figure it is set beside."""
    if rate is None:
        return {}
    steps = {int(run.rank0[i]["step"]) for i in window if i < len(run.rank0)}
    intervals = intervals_from_records(run.ranks)
    chosen = [k for k, iv in enumerate(intervals) if iv.end_step in steps]
    if not chosen:
        return {}
    bd = diagnose(
        intervals,
        solos_from_summary(run.summary),
        window=range(chosen[0], chosen[-1] + 1),
        steady_samples_per_s=rate,
    )
    if bd is None:
        return {}
    gap = bd.to_dict()
    cols = {f"gap_{name}_pct": gap["terms"][name]["pct"] for name in TERMS}
    return cols | {"gap_verdict": bd.verdict, "gap": gap}


def build_rows(
    run_dir: Path, manifest: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[RunData]]:
    """All rows of the scenario run in ``run_dir``, with speedups against ddp, equal, gpu-only."""
    runs = [load_run(run_dir / "runs" / name) for name in manifest["runs"]]
    runs = [r for r in runs if r.outcome or r.summary]
    rows = [row for run in runs for row in rows_for_run(run, manifest)]
    for ref, col in (
        (BASELINE, "speedup_vs_ddp"),
        ("equal", "speedup_vs_equal"),
        (GPU_ONLY, "speedup_vs_gpu_only"),
    ):
        by_window = {
            (*_pair(r), r["window"]): r["samples_per_s"] for r in rows if r["policy"] == ref
        }
        for r in rows:
            denom = by_window.get((*_pair(r), r["window"])) or by_window.get((*_pair(r), "steady"))
            r[col] = r["samples_per_s"] / denom if (denom and r["samples_per_s"]) else None
    single = single_gpu_rate(runs)
    for r in rows:
        world = r.get("world_size")
        r["scaling_efficiency"] = (
            r["samples_per_s"] / (world * single)
            if (single and world and r["samples_per_s"] and r["policy"] != GPU_ONLY)
            else None
        )
    for r in rows:
        for col in CSV_COLUMNS:
            r.setdefault(col, None)
    return rows, runs


def _pair(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a row's speedups compare within: data path, worker count and repeat."""
    return row["data_path"], row.get("num_workers"), row.get("repeat")


def single_gpu_rate(runs: list[RunData]) -> float | None:
    """One GPU's throughput for scaling efficiency: the fastest standalone rank of the
    plain-DDP run (each rank alone at B/W, the per-GPU share of plain data parallelism),
    i.e. an unshared GPU; ``None`` without that run's ideal."""
    for run in runs:
        if run.runner_is_ddp and run.summary:
            rates = [float(x) for x in run.summary.get("standalone_samples_per_s") or [] if x]
            return max(rates) if rates else None
    return None


def write_json(
    path: Path, manifest: dict[str, Any], rows: list[dict[str, Any]], extra: dict[str, Any]
) -> None:
    doc = {"meta": {k: v for k, v in manifest.items() if k != "specs"}, "rows": rows} | extra
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ";".join(_cell(x) for x in v)
    return str(v)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in CSV_COLUMNS])
