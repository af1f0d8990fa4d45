"""``hetero-top``: the Textual app, its watch worker and its actions.

Threads: one worker streams ``WatchCluster`` and posts each new immutable
``ClusterState``; the detail screen polls its job from another; cancel and
drain run in short-lived workers. The UI thread only reads states and never
waits on the network. When snapshots stop (the stream breaks, or nothing
arrives for ``stale_after_s``) a red banner says so, and the worker keeps
reconnecting with backoff until snapshots flow again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static, TabbedContent, TabPane

from hetero.core import defaults
from hetero.core.errors import DeniedError, HeteroError, RemoteError
from hetero.security.transport import ClientSecurity
from hetero.tui.client import CoordinatorClient
from hetero.tui.screens import ConfirmScreen, HelpScreen, JobDetailScreen
from hetero.tui.state import ClusterState
from hetero.tui.widgets import Banner, ClusterTable, JobsTable, StateTable

#: Reconnect backoff, seconds.
RETRY_MIN_S, RETRY_MAX_S = 0.5, 5.0

CSS = """
#title { height: 1; background: $primary-background; padding: 0 1; }
TabbedContent { height: 1fr; }
TabPane { padding: 0; }
DataTable { height: 1fr; }
#detail-summary { height: auto; padding: 0 1; background: $boost; }
#panels { grid-size: 1; grid-rows: auto; height: auto; grid-gutter: 0 1; }
JobDetailScreen.-wide #panels { grid-size: 2; }
ConfirmScreen, HelpScreen { align: center middle; }
#dialog { width: 60; height: auto; border: thick $error; background: $surface; padding: 1 2; }
#question { width: 100%; margin-bottom: 1; }
#buttons { height: auto; align: center middle; }
#buttons Button { margin: 0 2; }
#help { width: 84; max-width: 100%; height: auto; max-height: 100%; border: round $primary;
        background: $surface; padding: 0 1; }
"""


class SnapshotReceived(Message):
    def __init__(self, state: ClusterState) -> None:
        super().__init__()
        self.state = state


class Disconnected(Message):
    def __init__(self, reason: str, attempt: int) -> None:
        super().__init__()
        self.reason = reason
        self.attempt = attempt


class MainScreen(Screen[None]):
    """The Cluster and Jobs tabs, with the actions on their selected rows."""

    AUTO_FOCUS = "#cluster-table"

    BINDINGS = [
        Binding("1", "tab('cluster')", "cluster"),
        Binding("2", "tab('jobs')", "jobs"),
        Binding("d", "drain", "drain node"),
        Binding("x", "cancel", "cancel job"),
        Binding("enter", "open_job", "detail", show=False),
    ]

    @property
    def top(self) -> HeteroTop:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Banner(id="banner")
        with TabbedContent(id="tabs"):
            with TabPane("Cluster", id="cluster"):
                yield ClusterTable(id="cluster-table")
            with TabPane("Jobs", id="jobs"):
                yield JobsTable(id="jobs-table")
        yield Footer()

    def on_mount(self) -> None:
        # A snapshot can arrive before this screen is composed; show the newest one now.
        self.show(self.top.state)
        self.top.sync_banner(self.query_one(Banner))
        self.top.update_title()

    # Snapshots also arrive before compose and during shutdown, when the widgets are
    # not (or no longer) there: querying for all of them then finds none, and that is fine.
    def show(self, state: ClusterState) -> None:
        for table in self.query(StateTable):
            table.show(state)

    def set_title(self, text: str) -> None:
        for title in self.query("#title").results(Static):
            title.update(text)

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    @on(TabbedContent.TabActivated)
    def _focus_table(self, event: TabbedContent.TabActivated) -> None:
        # Keys and clicks on a tab both land here: arrows then move in that tab's table.
        # A stale event (keys pressed faster than tabs switch) must not focus a hidden table.
        if event.pane.id != self._active_tab():
            return
        table = ClusterTable if event.pane.id == "cluster" else JobsTable
        self.query_one(table).focus()

    def _active_tab(self) -> str:
        return str(self.query_one(TabbedContent).active)

    def action_open_job(self) -> None:
        job_id = self.query_one(JobsTable).selected_key
        if self._active_tab() == "jobs" and job_id:
            self.top.open_job(job_id)

    @on(DataTable.RowSelected, "#jobs-table")
    def _job_chosen(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.top.open_job(str(event.row_key.value))

    def action_cancel(self) -> None:
        if self._active_tab() != "jobs":
            self.notify("select a job on the Jobs tab (2) to cancel it", severity="warning")
            return
        job_id = self.query_one(JobsTable).selected_key
        job = self.top.state.job(job_id) if job_id else None
        if job is None:
            return
        if job.finished:
            self.notify(f"job {job.name} is already {job.state}", severity="warning")
            return
        self.top.confirm_cancel(job.id, job.name)

    def action_drain(self) -> None:
        if self._active_tab() != "cluster":
            self.notify(
                "select a device on the Cluster tab (1) to drain its node", severity="warning"
            )
            return
        node = self.query_one(ClusterTable).selected_node
        if node is None:
            return
        verb, op = ("Undrain", "undrain") if node.draining else ("Drain", "drain")
        what = "it takes new ranks again" if node.draining else "running ranks stay, no new ones"

        def answered(yes: bool | None) -> None:
            if yes:
                self.top.run_action_worker(op, node.name)

        self.app.push_screen(ConfirmScreen(f"{verb} node {node.name}? ({what})"), answered)


class HeteroTop(App[None]):
    TITLE = "hetero-top"
    CSS = CSS
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help", key_display="?"),
    ]

    def __init__(
        self,
        address: str = defaults.COORDINATOR_ADDRESS,
        *,
        period_s: float = 1.0,
        stale_after_s: float | None = None,
        watch: bool = True,
        security: ClientSecurity | None = None,
    ) -> None:
        """``watch=False`` starts no worker and polls nothing: states then arrive as
        ``SnapshotReceived`` messages posted by the caller (the snapshot tests do that)."""
        super().__init__()
        self.address = address
        self.period_s = period_s
        self.stale_after_s = stale_after_s or max(5.0, 3 * period_s)
        self.client = CoordinatorClient(address, security=security)
        self.state = ClusterState()
        self.main = MainScreen()
        self._watch = watch
        self._stop = threading.Event()
        self._last_snapshot = time.monotonic()
        self._connected_once = False
        self._problem: str | None = None
        #: Why the app ended on its own (a refused credential): ``main`` prints it and
        #: exits non-zero. Retrying cannot fix it, so the app does not keep trying.
        self.fatal: HeteroError | None = None

    def get_default_screen(self) -> Screen[None]:
        return self.main

    def on_mount(self) -> None:
        if self._watch:
            self.watch_cluster()
            self.set_interval(1.0, self._check_stale)

    def on_unmount(self) -> None:
        self._stop.set()
        self.client.close()

    # ---- the watch worker -------------------------------------------------------

    @work(thread=True, exclusive=True, group="watch")
    def watch_cluster(self) -> None:
        state, delay, attempt = ClusterState(), RETRY_MIN_S, 0
        while not self._stop.is_set():
            try:
                for snapshot in self.client.watch(self.period_s):
                    state = state.advance(snapshot)
                    self.post_message(SnapshotReceived(state))
                    delay, attempt = RETRY_MIN_S, 0
            except DeniedError as exc:  # a wrong or missing token: no retry will help
                self.fatal = exc
                self.call_from_thread(self.exit, None, exc.exit_code)
                return
            except RemoteError as exc:  # unreachable, or an answer it may not give again
                attempt += 1
                self.post_message(Disconnected(str(exc), attempt))
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, RETRY_MAX_S)

    def on_snapshot_received(self, message: SnapshotReceived) -> None:
        self.state = message.state
        self._last_snapshot = time.monotonic()
        self._connected_once = True
        if self._screens_gone():
            return
        self.main.show(self.state)
        self._set_problem(None)
        if isinstance(self.screen, JobDetailScreen):
            self.screen.redraw()  # its alerts read the cluster (device memory)

    def on_disconnected(self, message: Disconnected) -> None:
        # The gRPC reason is long and says little more than "unreachable": log it only.
        self.log.warning(message.reason)
        if self._screens_gone():
            return
        self._set_problem(
            f"DISCONNECTED from {self.address}: reconnecting (attempt {message.attempt})…"
        )

    def _screens_gone(self) -> bool:
        """True once the app has taken its screens down to exit. The watch worker may
        have posted a message just before: it is handled after, with nothing to draw on."""
        return not self.screen_stack

    def _check_stale(self) -> None:
        silent = time.monotonic() - self._last_snapshot
        if self._problem is None and silent > self.stale_after_s:
            self._set_problem(
                f"DISCONNECTED: no update from {self.address} for {silent:.0f}s; reconnecting…"
            )

    def _set_problem(self, problem: str | None) -> None:
        self._problem = problem
        for screen in self.screen_stack:
            for banner in screen.query(Banner):
                self.sync_banner(banner)
        self.update_title()

    def sync_banner(self, banner: Banner) -> None:
        if self._problem:
            banner.show_problem(self._problem)
        else:
            banner.clear_problem()

    @property
    def disconnected(self) -> bool:
        return self._problem is not None

    def update_title(self) -> None:
        s = self.state
        running = sum(1 for j in s.jobs if j.state == "running")
        up = sum(1 for n in s.nodes if n.status != "down")
        if self._problem:
            link = "[red]● disconnected[/]"
        elif self._connected_once:
            link = "[bold #4ebf71]● live[/]"
        else:
            link = "[yellow]● connecting[/]"
        self.main.set_title(
            f"[b]hetero-top[/b]  {self.address}  {link}  nodes {up}/{len(s.nodes)} up  "
            f"jobs {running}/{len(s.jobs)} running  devices {len(s.devices)}"
        )

    # ---- actions ----------------------------------------------------------------------

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def open_job(self, job_id: str) -> None:
        self.push_screen(JobDetailScreen(job_id, poll=self._watch))

    def confirm_cancel(self, job_id: str, name: str) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.run_action_worker("cancel", job_id)

        self.push_screen(ConfirmScreen(f"Cancel job {name} ({job_id})?"), answered)

    @work(thread=True, group="actions")
    def run_action_worker(self, op: str, target: str) -> None:
        """Cancel a job, or drain/undrain a node; the outcome is a notification."""
        try:
            if op == "cancel":
                text = f"job {self.client.cancel_job(target).name} cancelled"
            else:
                node = self.client.drain_node(target, undrain=op == "undrain")
                text = f"node {node.name} " + ("drained" if node.draining else "undrained")
        except HeteroError as exc:
            self.call_from_thread(self.notify, str(exc), title=op, severity="error")
            return
        self.call_from_thread(self.notify, text, title=op)


def main(argv: Sequence[str] | None = None) -> int:
    """``hetero-top``: see ``hetero.tui.cli``."""
    from hetero.tui.cli import main as cli_main

    return cli_main(argv)
