"""The outputs of a scenario run: results.json, results.csv, report.md and (optionally) PNGs.

:func:`write_outputs` is what both ``hetero-bench run`` (at the end) and
``hetero-bench report DIR`` (later, on any machine) call: it reads
``manifest.json`` and the runs' files, recomputes every figure, and rewrites
the outputs. Emulated scenarios say so in the title, every row and the CSV.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetero.bench.harness import plots, targets
from hetero.bench.harness.forecast import exclusion_forecasts
from hetero.bench.harness.results import (
    GAP_COLUMNS,
    RunData,
    build_rows,
    run_changes,
    write_csv,
    write_json,
)
from hetero.core.errors import ConfigError
from hetero.core.verdict import lines as gap_lines

FIGURES_HELP = """\
- **samples/s**: median of the job's per-interval throughput over the steady
  window (the latter half of the run, or of each phase between changes).
- **% of ideal**: samples/s over the sum of each rank's standalone throughput at
  its final planned batch, measured one rank at a time after training in the
  same run (plain DDP: each rank alone at B/W). Only for the last phase.
- **vs DDP / vs equal / vs GPU-only**: samples/s over that run's, same window
  (and the same data path, worker count and repeat: a pair that ran together).
- **imbalance**: median over the window of max/mean per-rank compute-only time
  − 1 (plain DDP has no compute-only time: from its standalone step times).
- **adapt**: intervals (× rebalance interval = steps) after a change until the
  throughput is within 5% of the new phase's steady value for 2 intervals.
- **scaling eff.**: samples/s over (ranks × one GPU's throughput); one GPU's
  throughput is the fastest rank of plain DDP's standalone runs (an unshared
  GPU at B/W).
- **predicted (err)**: the samples/s the dynamic fit predicts for the final
  plan from the intervals before the steady window (what the planner knew when
  it chose the plan), and its error against the measured samples/s.
- **GPU util**: mean NVML utilization per GPU over the window (n/a without NVML).
- **plan changes**: per 20 intervals; each change's cost in steps (the busy time
  its first steps at the new batch took beyond the settled median, over the
  median settled step, the costliest rank); whole-run / steady: samples/s over
  every interval but the first against the steady window's (a run without
  changes); why the plan held still: what the planner said most often, its
  `not_helping` where it gave one, else its reason at the boundaries where it
  kept the plan.
- **settle** (targets): intervals after a change until the first interval within
  5% of the new phase's steady samples/s (`adapt` also asks the next to stay).
- **where the gap went** (last phase): the share of the ideal lost to imbalance
  (the busiest rank's busy time against the ranks' weighted mean, busy = input
  wait + compute + optimizer), input wait, exposed communication (the busiest
  rank's gradients ready → all-reduced), compute lost to overlap and a slower
  optimizer (against each rank alone at the same batch), plan changes (intervals
  that ran a new plan, beyond the steady pace), the boundary exchange and pauses
  between steps. Every term ≥ 0; over the window's wall time (its own % of
  ideal, which can differ from the median-interval figure above) % of ideal +
  the terms = 100. Definitions in docs/design.md ("The gap breakdown").
"""


def _switch(s: dict[str, Any]) -> str:
    gpu = f"GPU {s['gpu']} " if "gpu" in s else ""
    return f"{gpu}{'on' if s['on'] else 'off'}@{s['step']}"


def _predicted(r: dict[str, Any]) -> str:
    if not r.get("predicted_samples_per_s"):
        return "n/a"
    return f"{_f(r['predicted_samples_per_s'])} ({r['prediction_error']:+.1%})"


def load_manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "manifest.json"
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a hetero-bench run directory (no manifest.json)")
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def write_outputs(run_dir: Path, *, draw_plots: bool = True) -> dict[str, Any]:
    """(Re)write results.json, results.csv, report.md and, if matplotlib is there, the PNGs."""
    manifest = load_manifest(run_dir)
    rows, runs = build_rows(run_dir, manifest)
    sc = manifest["scenario"]
    forecasts: dict[str, list[dict[str, Any]]] = {}
    if sc["devices"] == "mixed":
        for run in runs:
            if run.runner_is_ddp or run.name == "gpu-only" or len(run.ranks) < 2:
                continue
            cpus = cpu_ranks(manifest)
            kinds = ["cpu" if r in cpus else "cuda" for r in range(len(run.ranks))]
            forecasts[run.name] = exclusion_forecasts(
                run.ranks, int(sc["global_batch"]), cpus, int(sc.get("min_batch", 1)), kinds
            )
    changes = _changes(runs, manifest)
    checks = targets.check(targets.parse_targets(sc.get("targets"), "targets"), rows)
    pngs: list[Path] = []
    if draw_plots:
        pngs = plots.draw(run_dir, runs, changes, sc["name"])
    extra = {"exclusion_forecasts": forecasts, "targets": checks}
    write_json(run_dir / "results.json", manifest, rows, extra)
    write_csv(run_dir / "results.csv", rows)
    (run_dir / "report.md").write_text(render(manifest, rows, runs, forecasts, pngs, checks))
    return {"rows": rows, "plots": pngs, "targets": checks}


def _changes(runs: list[RunData], manifest: dict[str, Any]) -> list[tuple[int, str]]:
    for run in runs:
        ch = run_changes(run, manifest)
        if ch:
            return ch
    return [(int(s), str(label)) for s, label in manifest.get("changes", [])]


def _steady(rows: list[dict[str, Any]], policy: str) -> float | None:
    for r in rows:
        if r["policy"] == policy and r["window"] in ("steady", "whole-run"):
            return float(r["samples_per_s"]) if r["samples_per_s"] else None
    return None


def _f(v: Any, fmt: str = "{:,.0f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _util(v: Any) -> str:
    if not v:
        return "n/a"
    return " / ".join("n/a" if u is None else f"{u:.0f}%" for u in v)


def _memory_section(rows: list[dict[str, Any]]) -> list[str]:
    """Per-rank peak memory against the start-up probe's prediction, where a run has both."""
    probed = [r for r in rows if r.get("predicted_peak_memory_gb") and r["window"] != "whole-run"]
    if not probed:
        return []
    out = [
        "",
        "## Memory per rank (GB)",
        "",
        "Measured: the largest `max_memory_allocated` of any interval. Predicted: the start-up",
        "probe's line (fixed + per-sample × the batch that interval ran, plus the optimizer",
        "state) at that interval's batch. Error: the largest over every interval of every rank.",
        "",
        "| run | measured peak | predicted | largest error |",
        "| --- | --- | --- | ---: |",
    ]
    for r in probed:
        out.append(
            f"| {r['run']} | {r['peak_memory_gb']} | {r['predicted_peak_memory_gb']} | "
            f"{_f(r.get('memory_prediction_error'), '{:.2%}')} |"
        )
    return out


def _stability_section(rows: list[dict[str, Any]]) -> list[str]:
    """Per run: how still the plan held, what each change cost, and why it held."""
    runs = {r["run"]: r for r in rows if r.get("intervals") and r["policy"] != "ddp"}
    if not runs:
        return []
    out = [
        "",
        "## Plan changes",
        "",
        "| run | intervals | changes per 20 intervals | cost per change (steps) | whole-run / steady "
        "| why the plan held still |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    for name, r in runs.items():
        costs = ", ".join(f"{c:.2f}" for c in r.get("change_costs_steps") or ()) or "n/a"
        out.append(
            f"| {name} | {r['intervals']} | {_f(r.get('plan_changes_per_20'), '{:.1f}')} | "
            f"{costs} | {_f(r.get('whole_vs_steady'), '{:.3f}')} | {r.get('hold_reason') or 'n/a'} |"
        )
    return out


def _gap_section(rows: list[dict[str, Any]]) -> list[str]:
    """Where each run's gap to the ideal went: the shares, the verdict, the full breakdown."""
    with_gap = [r for r in rows if r.get("gap")]
    if not with_gap:
        return []
    out = [
        "",
        "## Where the gap went (% of ideal)",
        "",
        "| run | window | % of ideal | imbalance | input wait | exposed comm | overlap "
        "| optimizer | plan changes | boundary | pauses | verdict |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in with_gap:
        shares = " | ".join(_f(r.get(c), "{:.1f}") for c in GAP_COLUMNS)
        # The breakdown's own % of ideal (the window's wall time), with which its terms
        # make 100.
        pct = r["gap"].get("pct_of_ideal")
        out.append(
            f"| {r['run']} | {r['window']} | {_f(pct, '{:.1f}')} | {shares} | {r['gap_verdict']} |"
        )
    for r in with_gap:
        out += ["", f"**{r['run']}** ({r['window']}):", "", "```", *gap_lines(r["gap"]), "```"]
    return out


def cpu_ranks(manifest: dict[str, Any]) -> list[int]:
    """The CPU ranks of a mixed scenario: they follow its GPU ranks."""
    sc = manifest["scenario"]
    return list(range(int(sc["gpus"]), int(sc["ranks"])))


def render(
    manifest: dict[str, Any],
    rows: list[dict[str, Any]],
    runs: list[RunData],
    forecasts: dict[str, list[dict[str, Any]]],
    pngs: list[Path],
    checks: list[dict[str, Any]] | None = None,
) -> str:
    sc = manifest["scenario"]
    emulated = bool(sc.get("slowdowns") or sc.get("input_cost_ms"))
    tag = " (EMULATED heterogeneity)" if emulated else ""
    lines = [
        f"# hetero-bench: {sc['name']}{tag}",
        "",
        f"{sc['description']}",
        "",
        f"- date: {manifest.get('date')}; device: {manifest.get('device')}; host: {manifest.get('host')}",
        f"- model {sc['model']}, global batch {sc['global_batch']}, amp {sc['amp']}, "
        f"channels_last {sc['channels_last']}, rebalance every {sc['rebalance_interval']} steps, "
        f"{sc['steps']} steps{' (--quick)' if manifest.get('quick') else ''}",
        f"- command: `{manifest.get('command')}`",
        f"- software: {manifest.get('software')}",
    ]
    if sc.get("slowdowns"):
        lines.append(
            "- **EMULATED**: slow ranks wait (factor − 1) × their measured compute; "
            "these are not measurements of slow hardware."
        )
    if sc.get("input_cost_ms"):
        lines.append(
            f"- **EMULATED input cost** `{sc['input_cost_ms']}`: the loader workers busy-wait "
            "that many ms per sample (RANK:MS); not a measured pipeline."
        )
    if sc.get("loader_jitter"):
        lines.append(
            f"- loader jitter `{sc['loader_jitter']}`: an injected, seeded sleep per sample in "
            "the workers (bench/zoo/delays.py), the same in every run."
        )
    if manifest.get("changes"):
        lines.append(
            "- changes: " + ", ".join(f"step {s}: {lab}" for s, lab in manifest["changes"])
        )
    lines += [
        "",
        "| run | window | samples/s | % of ideal | vs DDP | vs equal | scaling eff. | predicted (err) | imbalance | adapt (steps) | GPU util | final plan |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        gpu_only = (
            f" (vs GPU-only {_f(r.get('speedup_vs_gpu_only'), '{:.2f}x')})"
            if r.get("speedup_vs_gpu_only") and r["policy"] != "gpu-only"
            else ""
        )
        lines.append(
            f"| {r['run']}{'' if r['ok'] else ' FAILED'} | {r['window']} {r['window_label']} | "
            f"{_f(r['samples_per_s'])} | {_f(r['pct_of_ideal'], '{:.1f}%')} | "
            f"{_f(r['speedup_vs_ddp'], '{:.2f}x')}{gpu_only} | {_f(r['speedup_vs_equal'], '{:.2f}x')} | "
            f"{_f(r.get('scaling_efficiency'), '{:.1%}')} | {_predicted(r)} | "
            f"{_f(r['imbalance'], '{:.1%}')} | {_f(r.get('adaptation_steps'), '{}')} | "
            f"{_util(r.get('gpu_util_pct'))} | {r.get('final_plan') or 'n/a'} |"
        )
    lines += targets.section(checks or [])
    lines += _stability_section(rows)
    lines += _memory_section(rows)
    lines += _gap_section(rows)
    lines += ["", "## Figures", "", FIGURES_HELP]
    if forecasts:
        lines += ["## Does the planner say the CPU ranks should go?", ""]
        alone = _steady(rows, "gpu-only")
        for name, fs in forecasts.items():
            for f in fs:
                lines.append(f"- {name}, planner forecast: {f['message']}")
            gone = [f["rank"] for f in fs if f.get("coordinator_excludes")]
            lines.append(
                f"- {name}, the coordinator (`resources.allow_exclusion`, a checkpoint): "
                + (
                    f"restarts the job without rank {gone[0]} where the steps left repay the "
                    "restart (its start-up plus the steps since the checkpoint)"
                    if gone
                    else "keeps every rank (no straggler whose forecast cleared 5% for 3 intervals)"
                )
            )
            every = [f for f in fs if len(f.get("ranks") or ()) == len(cpu_ranks(manifest))]
            if alone and every and every[-1].get("samples_per_s_without"):
                predicted = every[-1]["samples_per_s_without"]
                lines.append(
                    f"- {name}, forecast without every CPU rank against the measured GPU alone: "
                    f"{predicted:,.0f} vs {alone:,.0f} samples/s ({predicted / alone - 1:+.1%})"
                )
            mine = _steady(rows, name)
            if alone and mine:
                verdict = "faster" if alone > mine else "slower"
                lines.append(
                    f"- {name}, measured: the GPU alone ran {abs(alone / mine - 1):.0%} {verdict} "
                    f"({alone:,.0f} vs {mine:,.0f} samples/s with the CPU ranks)"
                )
        lines += [
            "",
            "The forecast charges the smaller job the all-reduce of its own world size (ring",
            "all-reduce: 2(W-1)/W of the gradient per rank); without every CPU rank one rank is",
            "left, with no all-reduce at all, which the measured GPU-alone run shows.",
            "",
        ]
    failed = [
        run
        for run in runs
        if run.outcome.get("error") or run.outcome.get("returncode") not in (0, None)
    ]
    if failed:
        lines += ["## Failed runs", ""]
        for run in failed:
            lines.append(
                f"- {run.name}: {run.outcome.get('error')} (see runs/{run.name}/stderr.log)"
            )
        lines.append("")
    lines += ["## Runs", ""]
    for run in runs:
        o = run.outcome
        switches = ", ".join(_switch(s) for s in o.get("switches", []))
        lines.append(
            f"- **{run.name}** ({o.get('runner')}), {o.get('wall_s', 0):.0f} s, exit {o.get('returncode')}"
            + (f", neighbour {switches}" if switches else "")
            + f": `{o.get('command', '')}`"
        )
    if pngs:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in pngs]
    else:
        lines += [
            "",
            "Plots: none here (matplotlib missing); run `hetero-bench report DIR` where it is.",
        ]
    return "\n".join(lines) + "\n"
