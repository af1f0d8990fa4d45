"""The job-detail panels as rich ``Text``, for a given width: pure, so they are tested
and rendered the same with or without Textual."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

from hetero.tui import format as fmt
from hetero.tui.alerts import Alert
from hetero.tui.detail import JobDetailView
from hetero.tui.state import JobView

#: Columns a rank label takes: "r0 gpu-a:0 " and so on.
LABEL_WIDTH = 12
ALERT_STYLES = {
    "straggler": "bold red",
    "input-bound": "yellow",
    "communication-bound": "yellow",
    "memory-bound": "yellow",
}


def _label(job: JobView, rank: int) -> Text:
    r = next((x for x in job.ranks if x.rank == rank), None)
    where = f"{r.node_name}:{r.device_index}" if r else "?"
    return Text(f"r{rank} {where}"[: LABEL_WIDTH - 1].ljust(LABEL_WIDTH), style="bold")


def _emulated_note(job: JobView, rank: int) -> Text:
    r = next((x for x in job.ranks if x.rank == rank), None)
    if r is None or r.emulated_slowdown in (0.0, 1.0):
        return Text()
    return Text(f" emu×{r.emulated_slowdown:g}", style="yellow")


def summary(job: JobView) -> Text:
    """Two lines: identity and state, then throughput against `equal` and ideal."""
    steps = f"{job.last_step}/{job.total_steps}" if job.total_steps else f"{job.last_step}"
    out = Text()
    out.append(job.name, style="bold")
    out.append(f"  {job.id}  ", style="dim")
    out.append(job.state, style=_state_style(job.state))
    where = f"attached: {job.launcher}" if job.launcher else job.backend
    out.append(f"  step {steps}  {job.policy}  {where}  plan v{job.plan_version}")
    if job.restarts:
        out.append(f"  restarts {job.restarts}", style="yellow")
    if job.emulated:
        out.append("  EMULATED", style="bold yellow")
    if job.owner:
        out.append(f"  owner {job.owner}", style="dim")
    out.append("\n")
    live = job.live
    if live is None:
        if job.state == "queued":
            out.append(f"queued: {job.message}", style="magenta")
            return out
        out.append("no interval reported yet", style="dim")
        return out
    out.append(f"samples/s {fmt.rate(live.samples_per_s)}", style="bold")
    if live.samples_per_s and live.equal_samples_per_s:
        gain = live.samples_per_s / live.equal_samples_per_s
        out.append(f"   equal {fmt.rate(live.equal_samples_per_s)} ({gain:.2f}× now)")
    if live.samples_per_s and live.ideal_samples_per_s:
        share = live.samples_per_s / live.ideal_samples_per_s
        out.append(f"   ideal {fmt.rate(live.ideal_samples_per_s)} ({share:.0%} of it)")
    if live.loss is not None:
        out.append(f"   loss {live.loss:.4g}")
    if job.message:
        out.append(f"\n{job.message}", style="italic")
    return out


def _state_style(state: str) -> str:
    return {
        "running": "green",
        "pending": "cyan",
        "queued": "magenta",
        "restarting": "bold yellow",
        "succeeded": "bold green",
        "failed": "bold red",
        "cancelled": "dim",
    }.get(state, "")


def batch_chart(view: JobDetailView, width: int) -> Text:
    """Per rank: its batch over the intervals (shared scale), then the current batch."""
    spark_w = max(width - LABEL_WIDTH - 6, 4)
    hi = max((max(b) for b in view.batches if b), default=1)
    out = Text()
    for rank, series in enumerate(view.batches):
        if rank:
            out.append("\n")
        out.append_text(_label(view.job, rank))
        out.append(fmt.sparkline(fmt.stretch(series, spark_w), spark_w, 0, hi), style="cyan")
        out.append(f" {series[-1] if series else '-':>4}")
    return out if view.batches else Text("no intervals yet", style="dim")


def per_sample_chart(view: JobDetailView, width: int, flagged: Sequence[int] = ()) -> Text:
    """Per rank: compute time per sample over the intervals (shared scale), then the newest."""
    # Room for " emu×2" after the value when any rank is emulated.
    spark_w = max(width - LABEL_WIDTH - 9 - (7 if view.job.emulated else 0), 4)
    clean = [[v for v in s if not math.isnan(v)] for s in view.per_sample_s]
    hi = max((max(s) for s in clean if s), default=1.0)
    out = Text()
    for rank, series in enumerate(clean):
        if rank:
            out.append("\n")
        out.append_text(_label(view.job, rank))
        style = "red" if rank in flagged else "green"
        out.append(fmt.sparkline(fmt.stretch(series, spark_w), spark_w, 0, hi), style=style)
        out.append(f" {fmt.millis(series[-1]) if series else fmt.NA:>7}")
        out.append_text(_emulated_note(view.job, rank))
    return out if clean else Text("no intervals yet", style="dim")


def breakdown_bars(view: JobDetailView, width: int) -> Text:
    """The newest interval's step time per rank as stacked bars on one scale, and a legend."""
    if not view.breakdown:
        return Text("no intervals yet", style="dim")
    bar_w = max(width - LABEL_WIDTH - 8, 4)
    longest = max(p.step_s for p in view.breakdown) or 1.0
    out = Text()
    for p in view.breakdown:
        out.append_text(_label(view.job, p.rank))
        parts = [(s, style) for s, (_, style) in zip(p.parts(), fmt.PHASE_STYLES, strict=True)]
        parts.append((p.other_s, "grey37"))
        out.append_text(fmt.stacked_bar(parts, longest, bar_w))
        out.append(f" {fmt.millis(p.step_s)}\n")
    for name, style in fmt.PHASE_STYLES:
        out.append("█", style=style)
        out.append(f" {name}  ")
    if not all(p.split for p in view.breakdown):
        out.append("(compute not split: drawn as forward)", style="dim")
    return out


def loss_chart(view: JobDetailView, width: int, height: int = 4) -> Text:
    if not view.loss:
        return Text("no loss reported", style="dim")
    values = [v for _, v in view.loss]
    chart_w = max(width - 9, 4)
    rows = fmt.area_chart(fmt.stretch(values, chart_w), chart_w, height)
    out = Text()
    for i, row in enumerate(rows):
        edge = max(values[-width:]) if i == 0 else min(values[-width:]) if i == height - 1 else None
        out.append(f"{edge:>8.3g} " if edge is not None else " " * 9, style="dim")
        out.append(row, style="magenta")
        out.append("\n")
    out.append(f"step {view.loss[0][0]} … {view.loss[-1][0]}, now {values[-1]:.4g}", style="dim")
    return out


def alerts_text(alerts: Sequence[Alert]) -> Text:
    if not alerts:
        return Text("no alerts", style="green")
    out = Text()
    for i, a in enumerate(alerts):
        if i:
            out.append("\n")
        out.append("▲ ", style=ALERT_STYLES.get(a.kind, "yellow"))
        out.append(a.message)
    return out


def events_text(view: JobDetailView, now_unix_s: float, limit: int = 12) -> Text:
    """The newest ``limit`` events, newest last, each with its age at ``now_unix_s``."""
    if not view.events:
        return Text("no events", style="dim")
    out = Text()
    for i, e in enumerate(view.events[-limit:]):
        if i:
            out.append("\n")
        out.append(f"{fmt.age(now_unix_s - e.time_unix_s):>4} ", style="dim")
        out.append(f"{e.kind:<14} ", style="bold")
        out.append(e.message)
    return out
