"""What a built-in job tells its user: progress lines, the evaluation, the summary.

The summary is the run's result (``--summary-json``, ``--json``, the table at
the end, ``ht.train``'s return value): throughput over the whole run and in
steady state, the plans, the ideal, the steps and epochs, and whether the
heterogeneity was emulated or simulated.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import nn

from hetero.core.slowdown import format_slowdowns
from hetero.trainer import safefile
from hetero.trainer.context import Context
from hetero.trainer.control import AgentPlanner
from hetero.trainer.datasets import build_dataset
from hetero.trainer.jobconfig import JobConfig
from hetero.trainer.precision import Autocast
from hetero.trainer.runsummary import unmeasured
from hetero.trainer.tasks import Task, evaluate

#: Seconds of scoring after which rank 0 says how far it got, and then every how many.
EVAL_QUIET_S = 5.0
EVAL_PROGRESS_S = 10.0


def progress(ctx: Context, cfg: JobConfig, total_steps: int, t0: float) -> None:
    """A progress line on rank 0 at about every twentieth interval boundary, and at the
    last step: a run shorter than one interval (a first smoke test of a large model on
    a CPU) says it trained, without the interval's figures it has not measured."""
    if ctx.rank != 0 or cfg.quiet:
        return
    if not ctx.summaries:
        if ctx.global_step >= total_steps:
            print(
                f"step {ctx.global_step:>6}/{total_steps}  plan {list(ctx.plan)}  "
                f"{time.perf_counter() - t0:6.1f}s  (no whole rebalance interval of "
                f"{cfg.rebalance_interval} steps: no loss or per-rank figures)",
                flush=True,
            )
        return
    n_intervals = max(total_steps // cfg.rebalance_interval, 1)
    every = max(n_intervals // 20, 1)
    if len(ctx.summaries) % every and ctx.global_step < total_steps:
        return
    s = ctx.summaries[-1]
    samples = sum(r.samples for r in s)
    loss = sum(r.loss_sum for r in s) / samples if samples else float("nan")
    rec_wall = time.perf_counter() - t0
    tag = " (emulated slowdown)" if ctx.emulated else ""
    print(
        f"step {ctx.global_step:>6}/{total_steps}  loss {loss:7.4f}  "
        f"plan {list(ctx.plan)}  compute/sample ms "
        f"{[round(r.compute_s / r.batch * 1e3, 2) if r.batch else None for r in s]}  "
        f"{rec_wall:6.1f}s{tag}",
        flush=True,
    )


def ideal_steps(cfg: JobConfig, trained: int) -> int:
    """Steps each rank runs alone for the ideal: ``ideal_steps``, but no more than the run
    trained (after 2 warm-up steps): a 2-step smoke test spent ten times its own length
    measuring it. 0: not measured."""
    return min(cfg.ideal_steps, max(trained, 0))


def measuring_ideal(ctx: Context, cfg: JobConfig, steps: int) -> None:
    """Rank 0's line before the ideal measurement: on a CPU, a large model's solo steps
    take minutes, and a run that printed nothing for them looked hung."""
    if ctx.rank == 0 and not cfg.quiet:
        print(
            f"measuring the ideal: each rank alone for {steps} steps (--ideal-steps 0 skips it)",
            flush=True,
        )


def _unmeasured_ideal(cfg: JobConfig) -> str:
    return "--ideal-steps 0" if cfg.ideal_steps <= 0 else "the run trained no step"


def evaluate_rank0(
    ctx: Context,
    cfg: JobConfig,
    task: Task,
    raw: nn.Module,
    train_set: Any,
    batch: int,
    *,
    samples: int,
) -> dict[str, Any]:
    """Rank 0 only, on the unwrapped model (no collectives): ``samples`` of CIFAR's test
    split, else of the training data. Unless ``quiet``, a scoring that runs past
    ``EVAL_QUIET_S`` says how far it got every ``EVAL_PROGRESS_S`` seconds."""
    split = "train"
    data = train_set
    if cfg.dataset in ("cifar10", "cifar100"):
        test = build_dataset(
            cfg.dataset, image_size=0, num_classes=0, data_dir=cfg.data_dir, train=False
        )
        if len(test):  # type: ignore[arg-type]
            data, split = task.prepare(test, raw, seed=cfg.seed), "test"
    model = Autocast(raw, ctx.device, cfg.amp) if cfg.amp != "none" else raw
    t0 = time.perf_counter()
    shown = [t0 + EVAL_QUIET_S - EVAL_PROGRESS_S]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if cfg.quiet or now - shown[0] < EVAL_PROGRESS_S:
            return
        shown[0] = now
        print(f"evaluating on rank 0: {done}/{total} samples, {now - t0:.0f}s", flush=True)

    result: dict[str, Any] = evaluate(
        model, data, task, ctx.device, samples=samples, batch=batch, progress=progress
    )
    result["eval_split"] = split
    return result


def summarize(
    ctx: Context,
    cfg: JobConfig,
    start_step: int,
    train_wall_s: float,
    final_plan: tuple[int, ...],
    standalone: list[float],
    side_by_side: list[float] | None = None,
) -> dict[str, Any]:
    """The run's result: throughput (whole run and steady state), plan, ideal, emulation."""
    intervals = ctx.summaries
    rates: list[float] = []
    samples_after_first = 0
    wall_after_first = 0.0
    for k, (iv, wall) in enumerate(zip(intervals, ctx.interval_walls, strict=True)):
        n = sum(r.samples for r in iv)
        if wall > 0:
            rates.append(n / wall)
        if k > 0:
            samples_after_first += n
            wall_after_first += wall
    steady_window = rates[len(rates) // 2 :] or rates
    steady = statistics.median(steady_window) if steady_window else 0.0
    overall = samples_after_first / wall_after_first if wall_after_first > 0 else steady
    # A rank whose standalone measurement ran out of memory reports 0: no ideal then.
    ideal = sum(standalone) if standalone and all(r > 0 for r in standalone) else None
    last = intervals[-1] if intervals else []
    losses = [sum(r.loss_sum for r in iv) / max(sum(r.samples for r in iv), 1) for iv in intervals]
    return {
        "name": cfg.name,
        "policy": cfg.policy,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "steps": ctx.global_step,
        "steps_this_run": ctx.global_step - start_step,
        "global_batch": cfg.global_batch_for(ctx.world_size),
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "throughput_samples_per_s": overall,
        "steady_samples_per_s": steady,
        "train_wall_s": train_wall_s,
        "final_plan": list(final_plan),
        "plan_changes": len(ctx.plans) - 1,
        "plans": [asdict(p) | {"batches": list(p.batches)} for p in ctx.plans],
        "not_helping": ctx.not_helping,
        "per_rank_compute_s": [r.compute_s for r in last],
        "per_rank_per_sample_ms": [r.compute_s / r.batch * 1e3 if r.batch else None for r in last],
        "channels_last": cfg.channels_last,
        # A pipeline's stages run their blocks through the model's recomputation switch,
        # which no rank's memory probe sets: nothing to report.
        "recompute": ctx.recompute.as_dict() if ctx.pipeline is None else None,
        "comm": ctx.comm_choice,
        "comm_final": ctx.comm_mode,
        "comm_changes": [asdict(c) for c in ctx.comm_changes],
        "interval_comm": list(ctx.interval_comm),
        "control_plane": ctx.planner.stats() if isinstance(ctx.planner, AgentPlanner) else None,
        "emulated": ctx.emulated,
        "emulated_slowdown": format_slowdowns(ctx.slowdowns) or None,
        "ideal_samples_per_s": ideal,
        "ideal_method": (
            f"sum over ranks of each rank's standalone throughput at the batch it ran last, "
            f"measured one rank at a time after training, the batch on the device "
            f"({ideal_steps(cfg, ctx.global_step - start_step)} steps each, median)"
            if standalone
            else f"not measured ({_unmeasured_ideal(cfg)})"
        ),
        "standalone_samples_per_s": standalone,
        "pct_of_ideal": 100.0 * steady / ideal if ideal and rates else None,
        "throughput_note": None if rates else unmeasured(ctx),
        # CPU only: the ranks measured at the same time, sharing the host's cores.
        "side_by_side_samples_per_s": sum(side_by_side) if side_by_side else None,
        "pct_of_side_by_side": 100.0 * steady / sum(side_by_side) if side_by_side else None,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "interval_losses": losses,
    }


def write(summary: dict[str, Any], path: str | None, as_json: bool) -> None:
    """The summary to ``path`` (if any) and to stdout, as JSON or as a table."""
    if path:
        safefile.write_text(Path(path), json.dumps(summary, indent=2) + "\n")
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from hetero.core.verdict import lines as gap_lines

    title = (
        f"hetero-train: {summary['name'] + ', ' if summary.get('name') else ''}{summary['policy']}"
    )
    t = Table(title=title, show_header=False)
    t.add_column(style="bold")
    t.add_column()

    def rate(x: float | None) -> str:
        return f"{x:,.1f} samples/s" if x else "n/a"

    amp = f", {summary['amp']}" if summary.get("amp", "none") != "none" else ""
    t.add_row(
        "model", f"{summary['model']} ({summary['world_size']} ranks, {summary['backend']}{amp})"
    )
    t.add_row("steps x global batch", f"{summary['steps']} x {summary['global_batch']}")
    if summary.get("epochs") is not None:
        t.add_row(
            "epochs",
            f"{summary['epochs']:.2f} ({summary['steps_per_epoch']} steps of "
            f"{summary['samples_per_epoch']:,} samples each)",
        )
    note = summary.get("throughput_note")
    if note:
        t.add_row("throughput", note)
    else:
        t.add_row("throughput (steady)", rate(summary["steady_samples_per_s"]))
        t.add_row("throughput (whole run)", rate(summary["throughput_samples_per_s"]))
    ideal = summary["ideal_samples_per_s"]
    if ideal:
        t.add_row("ideal", rate(ideal))
    elif summary.get("standalone_samples_per_s"):
        t.add_row("ideal", "not measured: a rank ran out of memory alone")
    else:
        t.add_row("ideal", summary["ideal_method"])
    pct = summary["pct_of_ideal"]
    if pct is not None:
        t.add_row("% of ideal", f"{pct:.1f}%")
    if summary.get("side_by_side_samples_per_s"):
        t.add_row(
            "ranks side by side, no sync",
            f"{rate(summary['side_by_side_samples_per_s'])} "
            f"(job reaches {summary['pct_of_side_by_side']:.1f}%)",
        )
    t.add_row("final plan", str(summary["final_plan"]))
    if summary.get("pipeline"):
        t.add_row("pipeline", _pipeline_text(summary["pipeline"]))
    if summary.get("comm_final"):
        t.add_row("gradient all-reduce", _comm_text(summary))
    if summary.get("recompute"):
        t.add_row("activation checkpointing", _recompute_text(summary["recompute"]))
    if any(c is not None for c in summary.get("memory_caps") or []):
        t.add_row("memory caps (samples)", summary["memory_caps_text"])
    if summary.get("oom_retries"):
        t.add_row("steps retried after OOM", str(len(summary["oom_retries"])))
    if summary.get("eval_accuracy") is not None:
        t.add_row(
            f"eval ({summary['eval_split']}, {summary['eval_samples']:.0f})",
            f"loss {summary['eval_loss']:.4f}, accuracy {100 * summary['eval_accuracy']:.1f}%",
        )
    if summary.get("simulated_nodes"):
        t.add_row("simulation", f"SIMULATED {summary['simulated_nodes']} nodes on one device")
    t.add_row("plan changes", str(summary["plan_changes"]))
    if summary.get("not_helping"):
        t.add_row("hetero is not helping here", summary["not_helping"])
    t.add_row(
        "loss first -> last",
        f"{summary['loss_first']:.4f} -> {summary['loss_last']:.4f}"
        if summary["loss_first"] is not None
        else "not measured (no whole rebalance interval ran)",
    )
    if summary["emulated"]:
        t.add_row("heterogeneity", f"EMULATED ({summary['emulated_slowdown']})")
    if summary.get("gap"):
        t.add_row("where the gap went", summary["gap"]["verdict"])
    Console().print(t)
    if summary.get("gap"):
        print("\n".join(gap_lines(summary["gap"])))


def _pipeline_text(p: dict[str, Any]) -> str:
    """``2 stages x 1 replica, blocks 20 + 16, microbatch 4 (1f1b); ms a microbatch a
    stage: predicted 31.0, 30.2, measured 33.1, 30.9``."""

    def ms(values: list[float | None]) -> str:
        return ", ".join("n/a" if v is None else f"{v * 1e3:.1f}" for v in values)

    return (
        f"{p['stages']} stages x {p['replicas']} replica(s), blocks "
        f"{' + '.join(str(b) for b in p['blocks'])}, microbatch {p['microbatch']} "
        f"({p['schedule']}); ms a microbatch a stage: predicted "
        f"{ms(p['predicted_stage_s'])}, measured {ms(p['measured_stage_s'])}"
    )


def _comm_text(summary: dict[str, Any]) -> str:
    """The mode the run ended in, and why: ``deferred (comm=auto: deferred kept: overlap
    86.0 ms vs deferred 85.1 ms per step)``."""
    final, choice = summary["comm_final"], summary["comm"]
    changes = summary.get("comm_changes") or []
    if choice != "auto":
        return f"{final} (comm={choice})"
    if len(changes) <= 1:
        return f"{final} (comm=auto: no plan ran unchanged long enough for a trial of overlap)"
    return f"{final} (comm=auto: {changes[-1]['reason']})"


def _recompute_text(recompute: dict[str, Any]) -> str:
    """Which ranks recompute their activations, and why (``trainer.activations``)."""
    from hetero.trainer.activations import RecomputeChoice

    return RecomputeChoice.from_dict(recompute).text()
