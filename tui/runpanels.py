"""The run view's own panels as rich ``Text``, for a given width: the header, throughput
and evaluation curves, and the gap breakdown. Pure, like ``panels`` (whose batch,
compute, step-time and loss panels the run view shares with the job detail)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text

from hetero.core.verdict import lines as gap_lines
from hetero.tui import format as fmt
from hetero.tui.runview import RunView, Series

STATUS_STYLES = {
    "running": "bold #4ebf71",
    "finished": "bold green",
    "waiting": "yellow",
    "stopped": "bold red",
    "quiet": "yellow",
}
STATUS_WORDS = {
    "running": "● running",
    "finished": "● finished",
    "waiting": "● waiting for the first interval",
    "stopped": "● stopped: its process is gone and it did not close",
    "quiet": "● quiet: no record for a while",
}


def title(view: RunView) -> Text:
    """One line: the directory, the status, the job's shape."""
    job = view.job
    out = Text()
    out.append("hetero-top", style="bold")
    out.append(f"  run {view.files.path}  ")
    out.append(STATUS_WORDS.get(view.status, view.status), style=STATUS_STYLES.get(view.status))
    if job.world_size:
        out.append(f"  {job.world_size} ranks  {job.policy}  {job.backend}")
    return out


def summary(view: RunView, now_unix_s: float | None = None) -> Text:
    """Two or three lines: progress and plan, throughput against the ideal, loss, the age
    of the newest record; the emulated slowdown, said as such, when there is one."""
    job, live = view.job, view.job.live
    now = time.time() if now_unix_s is None else now_unix_s
    steps = f"{job.last_step}/{job.total_steps}" if job.total_steps else f"{job.last_step}"
    out = Text()
    out.append(job.name, style="bold")
    out.append(f"  step {steps}  global batch {job.global_batch}  plan v{job.plan_version}")
    if live is not None and live.ranks:
        out.append(f" {[r.batch for r in live.ranks]}")
    if view.files.updated_unix_s:
        out.append(f"  updated {fmt.age(now - view.files.updated_unix_s)} ago", style="dim")
    out.append("\n")
    if view.emulated:
        which = f" {view.emulated_slowdown}" if view.emulated_slowdown else ""
        out.append(
            f"EMULATED slowdown{which} (rank:factor): injected waits, not hardware\n",
            style="bold yellow",
        )
    if live is None:
        out.append("no interval recorded yet", style="dim")
        return out
    out.append(f"samples/s {fmt.rate(live.samples_per_s)}", style="bold")
    if live.samples_per_s and live.ideal_samples_per_s:
        share = live.samples_per_s / live.ideal_samples_per_s
        out.append(f"   ideal {fmt.rate(live.ideal_samples_per_s)} ({share:.0%} of it)")
    if live.loss is not None:
        out.append(f"   loss {live.loss:.4g}")
    for name, points in view.evals:
        out.append(f"   eval {name} {points[-1][1]:.4g}", style="cyan")
    return out


def curve(points: Series, width: int, style: str, unit: str = "", height: int = 4) -> Text:
    """``points`` (step, value) as a block chart with its range and the newest value."""
    if not points:
        return Text("nothing recorded yet", style="dim")
    values = [v for _, v in points]
    chart_w = max(width - 9, 4)
    rows = fmt.area_chart(fmt.stretch(values, chart_w), chart_w, height)
    shown = values[-chart_w:]
    out = Text()
    for i, row in enumerate(rows):
        edge = max(shown) if i == 0 else min(shown) if i == height - 1 else None
        out.append(_edge(edge, unit) if edge is not None else " " * 9, style="dim")
        out.append(row, style=style)
        out.append("\n")
    now = _value(values[-1], unit)
    out.append(f"step {points[0][0]} … {points[-1][0]}, now {now}", style="dim")
    return out


def _value(v: float, unit: str) -> str:
    return fmt.rate(v) if unit == "samples/s" else f"{v:.4g}"


def _edge(v: float, unit: str) -> str:
    return f"{_value(v, unit):>8} "


def evals_text(view: RunView, width: int) -> Text:
    """One curve per evaluation metric (accuracy first), or how to record them."""
    if not view.evals:
        return Text(
            "no evaluation recorded: hetero-train --eval-every N, or ctx.evaluate(fn) in a loop",
            style="dim",
        )
    order = sorted(view.evals, key=lambda e: (e[0] != "accuracy", e[0] != "loss"))
    out = Text()
    for i, (name, points) in enumerate(order[:3]):
        if i:
            out.append("\n")
        out.append(f"{name}\n", style="bold")
        out.append_text(curve(points, width, "cyan", height=3))
    return out


def gap_text(view: RunView) -> Text:
    """The breakdown's table (``hetero.core.verdict.lines``), with where it comes from."""
    if view.gap is None:
        return Text("no measured interval yet", style="dim")
    source = (
        "the finished run's summary (ideal: each rank alone)"
        if view.gap_final
        else "the records so far, no solo measurement yet: shares are of the step"
    )
    out = Text(f"from {source}\n", style="dim")
    body: Sequence[str] = gap_lines(view.gap)
    out.append("\n".join(body))
    return out
