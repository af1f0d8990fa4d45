"""hetero-top's screens: job detail, the confirmation dialog, and help.

The job-detail screen polls ``GetJobDetail`` from a thread worker every period
and redraws its panels from the immutable ``JobDetailView`` it gets back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Label, Static

from hetero.core.errors import HeteroError, UnreachableError
from hetero.tui import panels
from hetero.tui.alerts import job_alerts
from hetero.tui.detail import JobDetailView, detail_view
from hetero.tui.widgets import WIDE, Banner, Panel

if TYPE_CHECKING:
    from hetero.tui.app import HeteroTop

#: Intervals the detail screen asks for (its charts show at most this many).
DETAIL_INTERVALS = 120

HELP = """\
[b]hetero-top[/b]: the cluster and its jobs, live from the coordinator.

[b]Everywhere[/b]
  [b]1[/b] / [b]2[/b]      Cluster / Jobs tab (or click a tab)
  [b]↑ ↓[/b]        move in a table (or click a row; the wheel scrolls)
  [b]?[/b]          this help        [b]q[/b]  quit
[b]Cluster[/b]
  [b]d[/b]          drain the selected device's node, or undrain it (asks first)
[b]Jobs[/b]
  [b]enter[/b]      job detail (or click the row twice)
  [b]x[/b]          cancel the selected job (asks first)
[b]Job detail[/b]
  [b]x[/b]  cancel the job      [b]escape[/b]  back

A red banner means no update from the coordinator: hetero-top reconnects by
itself. "emu" marks an emulated slowdown: speeds are emulated, not measured.
"""


class DetailReceived(Message):
    def __init__(self, view: JobDetailView) -> None:
        super().__init__()
        self.view = view


class JobDetailScreen(Screen[None]):
    """One job: batches and per-sample compute per rank over time, step breakdown,
    loss, alerts and events."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("x", "cancel_job", "cancel job"),
        Binding("question_mark", "app.help", "help"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, job_id: str, *, poll: bool = True) -> None:
        super().__init__()
        self.job_id = job_id
        self.view: JobDetailView | None = None
        self._poll = poll
        self._reported: str | None = None

    @property
    def top(self) -> HeteroTop:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Banner(id="detail-banner")
        yield Static(Text(f"job {self.job_id}: loading…", style="dim"), id="detail-summary")
        with VerticalScroll(id="detail-scroll"), Grid(id="panels"):
            yield Panel("batch per rank (samples)", self._batches, id="p-batches")
            yield Panel("compute per sample", self._per_sample, id="p-per-sample")
            yield Panel("step time, newest interval", self._breakdown, id="p-breakdown")
            yield Panel("loss", self._loss, id="p-loss")
            yield Panel("alerts", self._alerts, id="p-alerts")
            yield Panel("events", self._events, id="p-events")
        yield Footer()

    def on_mount(self) -> None:
        self.top.sync_banner(self.query_one(Banner))
        if self._poll:
            self.fetch()
            self.set_interval(self.top.period_s, self.fetch)

    def on_resize(self) -> None:
        self.set_class(self.size.width >= WIDE, "-wide")

    @work(thread=True, exclusive=True, group="detail")
    def fetch(self) -> None:
        try:
            view = detail_view(self.top.client.job_detail(self.job_id, DETAIL_INTERVALS))
        except UnreachableError:
            return  # the banner says so already
        except HeteroError as exc:
            self.app.call_from_thread(self._report, str(exc))
            return
        self.post_message(DetailReceived(view))

    def _report(self, text: str) -> None:
        # Once per distinct error: a poll every second must not stack notifications.
        if text != self._reported:
            self._reported = text
            self.notify(text, title="job detail", severity="error")

    def on_detail_received(self, message: DetailReceived) -> None:
        self.show(message.view)

    def show(self, view: JobDetailView) -> None:
        self.view = view
        self._reported = None
        self.redraw()

    def redraw(self) -> None:
        if self.view is not None:
            for summary in self.query("#detail-summary").results(Static):
                summary.update(panels.summary(self.view.job))
        for panel in self.query(Panel):
            panel.render_for_width()

    # Panel contents, each for the panel's width.
    def _empty(self) -> Text:
        return Text("waiting for the coordinator…", style="dim")

    def _batches(self, width: int) -> Text:
        return panels.batch_chart(self.view, width) if self.view else self._empty()

    def _per_sample(self, width: int) -> Text:
        if not self.view:
            return self._empty()
        live = self.view.job.live
        flagged = [s.rank for s in live.stragglers] if live else []
        return panels.per_sample_chart(self.view, width, flagged)

    def _breakdown(self, width: int) -> Text:
        return panels.breakdown_bars(self.view, width) if self.view else self._empty()

    def _loss(self, width: int) -> Text:
        return panels.loss_chart(self.view, width) if self.view else self._empty()

    def _alerts(self, width: int) -> Text:
        if not self.view:
            return self._empty()
        return panels.alerts_text(job_alerts(self.view.job, self.top.state))

    def _events(self, width: int) -> Text:
        if not self.view:
            return self._empty()
        return panels.events_text(self.view, self.top.state.time_unix_s)

    def action_cancel_job(self) -> None:
        job = self.view.job if self.view else None
        self.top.confirm_cancel(self.job_id, job.name if job else self.job_id)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; dismisses with True only for an explicit yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            with Horizontal(id="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP)

    def on_click(self) -> None:
        self.dismiss(None)
