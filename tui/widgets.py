"""hetero-top's widgets: the cluster and jobs tables, the connection banner, a titled panel.

Tables keep their cursor across updates: rows are updated in place when the
set of rows is unchanged, and rebuilt (cursor restored by key) when it is not.
Columns depend on the width: narrow terminals get short columns and short
sparklines, wide ones everything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text
from textual.widgets import DataTable, Static

from hetero.tui import format as fmt
from hetero.tui.alerts import job_alerts
from hetero.tui.state import ClusterState, DeviceView, JobView, NodeView

#: Terminal columns from which tables and the detail screen use their wide layout.
WIDE = 120
Cell = str | Text
Column = tuple[str, str]  # key, label


def sync_rows(table: DataTable[Cell], rows: Sequence[tuple[str, Sequence[Cell]]]) -> None:
    """Show ``rows`` (key, cells) in ``table`` keeping the cursor on the same row key."""
    keys = [k for k, _ in rows]
    current = [str(k.value) for k in table.rows]
    columns = list(table.columns)
    if keys == current:
        for key, cells in rows:
            for column, cell in zip(columns, cells, strict=True):
                table.update_cell(key, column, cell, update_width=True)
        return
    selected = current[table.cursor_row] if 0 <= table.cursor_row < len(current) else None
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    if selected in keys:
        table.move_cursor(row=keys.index(selected), animate=False)


class StateTable(DataTable[Cell]):
    """A table of ``ClusterState`` rows with width-dependent columns."""

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.state = ClusterState()
        self._wide: bool | None = None

    def columns_for(self, wide: bool) -> Sequence[Column]:
        raise NotImplementedError

    def rows_for(self, state: ClusterState, wide: bool) -> list[tuple[str, Sequence[Cell]]]:
        raise NotImplementedError

    def show(self, state: ClusterState) -> None:
        self.state = state
        wide = self.size.width >= WIDE if self.size.width else False
        if wide != self._wide:
            self._wide = wide
            self.clear(columns=True)
            for key, label in self.columns_for(wide):
                self.add_column(label, key=key)
        sync_rows(self, self.rows_for(state, wide))

    def on_resize(self) -> None:
        self.show(self.state)

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return None if row_key.value is None else str(row_key.value)


def _status(node: NodeView, wide: bool = True) -> Text:
    style = {"up": "green", "down": "bold red", "draining": "yellow"}[node.status]
    return Text(node.status if wide or node.status != "draining" else "drain", style=style)


def _short_name(name: str) -> str:
    return name.removeprefix("NVIDIA ").removeprefix("GeForce ")


def _score(d: DeviceView) -> Text:
    out = Text(f"{d.compute_score:g}")
    if d.emulated:
        out.append(f" emu×{d.emulated_slowdown:g}", style="yellow")
    return out


def _with_spark(value: float | None, history: Sequence[float], width: int) -> Text:
    out = Text(fmt.percent(value).rjust(4))
    out.append(" ")
    out.append(fmt.sparkline(history, width, 0.0, 100.0), style="cyan")
    return out


class ClusterTable(StateTable):
    """One row per device: node, device, score, utilization, memory, temperature, power."""

    def columns_for(self, wide: bool) -> Sequence[Column]:
        if not wide:
            return [
                ("where", "node:dev"),
                ("name", "device"),
                ("score", "score"),
                ("util", "util"),
                ("mem", "mem"),
                ("temp", "temp"),
                ("power", "power"),
                ("status", "status"),
                ("hb", "hb"),
            ]
        return [
            ("node", "node"),
            ("dev", "dev"),
            ("kind", "kind"),
            ("name", "device"),
            ("score", "compute score"),
            ("util", "utilization"),
            ("mem", "memory"),
            ("memh", "memory history"),
            ("temp", "temp"),
            ("power", "power"),
            ("throttle", "throttle"),
            ("status", "status"),
            ("hb", "heartbeat"),
        ]

    def rows_for(self, state: ClusterState, wide: bool) -> list[tuple[str, Sequence[Cell]]]:
        rows: list[tuple[str, Sequence[Cell]]] = []
        spark = 24 if wide else 4
        for node in state.nodes:
            for d in node.devices:
                key = f"{node.id}/{d.index}"
                util = _with_spark(d.utilization_percent, d.utilization_history, spark)
                mem_pct = None if d.memory_fraction is None else 100 * d.memory_fraction
                hb = fmt.age(node.heartbeat_age_s)
                if not wide:
                    mem = _with_spark(mem_pct, d.memory_history, spark)
                    cells: list[Cell] = [
                        f"{node.name}:{d.index}",
                        _short_name(d.name)[:12],
                        _score(d),
                        util,
                        mem,
                        fmt.celsius(d.temperature_c),
                        fmt.watts(d.power_w),
                        _status(node, wide=False),
                        hb,
                    ]
                else:
                    used = f"{fmt.gib(d.memory_used_bytes)}/{fmt.gib(d.memory_total_bytes)}"
                    mem = fmt.usage_bar(d.memory_fraction, 10) + Text(f" {used}")
                    throttle = fmt.NA if d.throttle is None else ", ".join(d.throttle) or "none"
                    cells = [
                        node.name,
                        str(d.index),
                        d.kind,
                        d.name,
                        _score(d),
                        util,
                        mem,
                        Text(fmt.sparkline(d.memory_history, spark, 0.0, 100.0), style="cyan"),
                        fmt.celsius(d.temperature_c),
                        fmt.watts(d.power_w),
                        throttle,
                        _status(node),
                        f"{hb} ago",
                    ]
                rows.append((key, cells))
        return rows

    @property
    def selected_node(self) -> NodeView | None:
        key = self.selected_key
        node_id = key.split("/", 1)[0] if key else None
        return next((n for n in self.state.nodes if n.id == node_id), None)


def _progress(job: JobView, width: int) -> Text:
    if job.state == "queued":  # what it waits for, as much as fits (the detail has it all)
        room = max(width + 5, 6)
        reason = job.message.removeprefix("waiting for ")
        shown = reason if len(reason) <= room else reason[: room - 1] + "…"
        return Text(shown, style="magenta")
    frac = job.progress
    if frac is None:
        return Text(f"step {job.last_step}")
    if width <= 0:
        return Text(f"{frac:.0%}".rjust(4))
    filled = round(frac * width)
    bar = Text("█" * filled, style="blue") + Text("·" * (width - filled), style="dim")
    return bar + Text(f" {frac:.0%}".rjust(5))


class JobsTable(StateTable):
    """One row per job: state, progress, samples/s beside `equal` and ideal, policy, alerts."""

    def columns_for(self, wide: bool) -> Sequence[Column]:
        cols: list[Column] = [
            ("name", "job"),
            ("state", "state"),
            ("progress", "done"),
            ("rate", "samples/s"),
            ("equal", "equal"),
            ("ideal", "ideal"),
            ("policy", "policy"),
            ("restarts", "rst"),
            ("alerts", "alerts" if wide else "!"),
        ]
        if wide:
            cols.insert(0, ("id", "id"))
            cols.insert(2, ("owner", "owner"))
            cols.insert(8, ("ranks", "ranks"))
        return cols

    def rows_for(self, state: ClusterState, wide: bool) -> list[tuple[str, Sequence[Cell]]]:
        rows: list[tuple[str, Sequence[Cell]]] = []
        for job in state.jobs:
            live = job.live
            alerts = job_alerts(job, state)
            flag = Text(f"▲{len(alerts)}", style="bold red") if alerts else Text("-", style="dim")
            name = Text(job.name[: 30 if wide else 12])
            if job.emulated:
                name.append(" emu", style="yellow")
            if job.launcher:  # launched elsewhere and attached (``hetero.trainer.attach``)
                name.append(" ext", style="cyan")
            cells: list[Cell] = [
                name,
                Text(job.state, style=_state_style(job.state)),
                _progress(job, 12 if wide else 0),
                Text(fmt.rate(live.samples_per_s) if live else fmt.NA, style="bold"),
                fmt.rate(live.equal_samples_per_s if live else None),
                fmt.rate(live.ideal_samples_per_s if live else None),
                job.policy[: 20 if wide else 7],
                str(job.restarts),
                flag,
            ]
            if wide:
                cells.insert(0, job.id)
                cells.insert(2, Text(job.owner[:20] or "-", style="dim" if not job.owner else ""))
                cells.insert(8, str(job.world_size))
            rows.append((job.id, cells))
        return rows


def _state_style(state: str) -> str:
    styles = {"running": "green", "pending": "cyan", "queued": "magenta"}
    styles |= {"restarting": "bold yellow"}
    styles |= {"failed": "bold red", "cancelled": "dim"}
    return styles.get(state, "")


class Banner(Static):
    """The connection banner: hidden while snapshots arrive, red when they stop."""

    DEFAULT_CSS = """
    Banner { display: none; background: $error; color: $text; text-style: bold; padding: 0 1; }
    Banner.-shown { display: block; }
    """

    def show_problem(self, text: str) -> None:
        self.update(text)
        self.add_class("-shown")

    def clear_problem(self) -> None:
        self.remove_class("-shown")

    @property
    def shown(self) -> bool:
        return self.has_class("-shown")


class Panel(Static):
    """A bordered, titled panel whose content is rendered for its current width."""

    DEFAULT_CSS = """
    Panel { border: round $primary-darken-1; height: auto; padding: 0 1; }
    """

    def __init__(self, title: str, render_fn: Callable[[int], Text], *, id: str) -> None:
        super().__init__(id=id)
        self.border_title = title
        self._render_fn = render_fn

    def render_for_width(self) -> None:
        width = max(self.content_region.width, 20) if self.content_region.width else 60
        self.update(self._render_fn(width))

    def on_resize(self) -> None:
        self.render_for_width()
