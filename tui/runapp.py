"""``hetero-top --run DIR``: the live view of a standalone run, read from its output directory.

No coordinator: a thread worker polls the directory (``RunFollower``) every
period, builds the immutable ``RunView`` and posts it; the UI thread only draws.
Panels: throughput and evaluation curves, each rank's batch and compute per
sample over the intervals, the newest interval's step time by phase, loss, the
gap breakdown, alerts and plan changes. ``hetero-train --top`` runs the
training as a child process and this view (``hetero-top --run DIR``) as another
on its terminal; quitting the view stops the training.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from hetero.tui import panels, runpanels
from hetero.tui.alerts import job_alerts
from hetero.tui.runfiles import RunFollower
from hetero.tui.runview import RunView, run_view
from hetero.tui.state import ClusterState
from hetero.tui.widgets import WIDE, Panel

CSS = """
#run-title { height: 1; background: $primary-background; padding: 0 1; }
#run-summary { height: auto; padding: 0 1; background: $boost; }
#panels { grid-size: 1; grid-rows: auto; height: auto; grid-gutter: 0 1; }
RunScreen.-wide #panels { grid-size: 2; }
RunScreen.-wide #p-gap { column-span: 2; }
RunHelp { align: center middle; }
#help { width: 84; max-width: 100%; height: auto; max-height: 100%; border: round $primary;
        background: $surface; padding: 0 1; }
"""

HELP = """\
[b]hetero-top --run[/b]: a standalone run, live from its output directory.

  [b]↑ ↓[/b] / wheel   scroll the panels
  [b]?[/b]             this help        [b]q[/b]  quit

Throughput and loss are the whole job's per rebalance interval; batch, compute
per sample and step time are each rank's. The gap breakdown says where the
throughput missing from the ideal went: from the records while the run goes,
from its summary (with each rank measured alone) once hetero-train finishes.
"EMULATED" means the slowdown is an injected wait, not slower hardware.
"""


class RunUpdated(Message):
    def __init__(self, view: RunView) -> None:
        super().__init__()
        self.view = view


class RunHelp(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP)

    def on_click(self) -> None:
        self.dismiss(None)


class RunScreen(Screen[None]):
    """The run's header and panels."""

    def __init__(self) -> None:
        super().__init__()
        self.view: RunView | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="run-title")
        yield Static(Text("reading the run directory…", style="dim"), id="run-summary")
        with VerticalScroll(id="run-scroll"), Grid(id="panels"):
            yield Panel("throughput (samples/s)", self._throughput, id="p-throughput")
            yield Panel("evaluation", self._evals, id="p-eval")
            yield Panel("batch per rank (samples)", self._batches, id="p-batches")
            yield Panel("compute per sample", self._per_sample, id="p-per-sample")
            yield Panel("step time, newest interval", self._breakdown, id="p-breakdown")
            yield Panel("loss", self._loss, id="p-loss")
            yield Panel("where the gap to ideal went", self._gap, id="p-gap")
            yield Panel("alerts", self._alerts, id="p-alerts")
            yield Panel("plan changes", self._plans, id="p-plans")
        yield Footer()

    def on_resize(self) -> None:
        self.set_class(self.size.width >= WIDE, "-wide")

    def show(self, view: RunView) -> None:
        self.view = view
        for title in self.query("#run-title").results(Static):
            title.update(runpanels.title(view))
        for summary in self.query("#run-summary").results(Static):
            summary.update(runpanels.summary(view, view.now_unix_s))
        for panel in self.query(Panel):
            panel.render_for_width()

    def _empty(self) -> Text:
        return Text("no interval recorded yet", style="dim")

    def _throughput(self, width: int) -> Text:
        if not self.view:
            return self._empty()
        return runpanels.curve(self.view.throughput, width, "bold blue", "samples/s")

    def _evals(self, width: int) -> Text:
        return runpanels.evals_text(self.view, width) if self.view else self._empty()

    def _batches(self, width: int) -> Text:
        return panels.batch_chart(self.view.detail, width) if self.view else self._empty()

    def _per_sample(self, width: int) -> Text:
        return panels.per_sample_chart(self.view.detail, width) if self.view else self._empty()

    def _breakdown(self, width: int) -> Text:
        return panels.breakdown_bars(self.view.detail, width) if self.view else self._empty()

    def _loss(self, width: int) -> Text:
        return panels.loss_chart(self.view.detail, width) if self.view else self._empty()

    def _gap(self, width: int) -> Text:
        return runpanels.gap_text(self.view) if self.view else self._empty()

    def _alerts(self, width: int) -> Text:
        if not self.view:
            return self._empty()
        return panels.alerts_text(job_alerts(self.view.job, ClusterState()))

    def _plans(self, width: int) -> Text:
        if not self.view:
            return self._empty()
        return panels.events_text(self.view.detail, self.view.now_unix_s)


class RunTop(App[None]):
    TITLE = "hetero-top"
    CSS = CSS
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help", key_display="?"),
    ]

    def __init__(self, path: Path | str, *, period_s: float = 1.0, follow: bool = True) -> None:
        """``follow=False`` reads nothing: views arrive as ``RunUpdated`` messages posted
        by the caller (the snapshot tests do that)."""
        super().__init__()
        self.follower = RunFollower(path)
        self.period_s = period_s
        self.screen_ = RunScreen()
        self._follow = follow
        self._stop = threading.Event()

    def get_default_screen(self) -> Screen[None]:
        return self.screen_

    def on_mount(self) -> None:
        if self._follow:
            self.follow_run()

    def on_unmount(self) -> None:
        self._stop.set()

    @work(thread=True, exclusive=True, group="follow")
    def follow_run(self) -> None:
        while not self._stop.is_set():
            self.post_message(RunUpdated(run_view(self.follower.poll(), time.time())))
            self._stop.wait(self.period_s)

    def on_run_updated(self, message: RunUpdated) -> None:
        self.screen_.show(message.view)

    def action_help(self) -> None:
        if not isinstance(self.screen, RunHelp):
            self.push_screen(RunHelp())
