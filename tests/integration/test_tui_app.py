"""hetero-top driven with Textual's Pilot against a real coordinator fed by a simulated
cluster: what it shows, its actions, errors as notifications, and reconnecting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from simcluster import SimCluster, populate
from sqlalchemy import text
from textual.notifications import Notify
from textual.pilot import Pilot

from hetero.coordinator.server import Settings, create_server
from hetero.tui.app import Disconnected, HeteroTop, SnapshotReceived
from hetero.tui.screens import ConfirmScreen, HelpScreen, JobDetailScreen
from hetero.tui.state import ClusterState
from hetero.tui.widgets import Banner, ClusterTable, JobsTable, Panel
from hetero.v1 import coordinator_pb2 as pb

PERIOD_S = 0.2


async def until(pilot: Pilot[None], cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Let the app run until ``cond()`` holds; fail after ``timeout_s`` (a bound for a
    loaded two-core host, where the pilot and the coordinator share the cores)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.05)


def _cells(table: ClusterTable | JobsTable) -> list[str]:
    return [
        str(getattr(c, "plain", c)) for row in range(table.row_count) for c in table.get_row_at(row)
    ]


def test_cluster_and_jobs_show_the_simulated_cluster_and_detail_opens_by_mouse(
    coordinator, sim: SimCluster
) -> None:  # type: ignore[no-untyped-def]
    job = populate(sim)

    async def drive() -> None:
        app = HeteroTop(coordinator.address, period_s=PERIOD_S)
        async with app.run_test(size=(80, 24)) as pilot:
            cluster = app.query_one(ClusterTable)
            await until(pilot, lambda: cluster.row_count == 4)
            cells = _cells(cluster)
            assert "gpu-b:0" in cells and "A100 40GB" in cells and "60 emu×2" in cells
            assert any(c.endswith("°C") for c in cells) and "n/a" in cells, "CPU: no temperature"
            await pilot.click("Tab#--content-tab-jobs")  # the Jobs tab, by mouse
            jobs = app.query_one(JobsTable)
            await until(pilot, lambda: jobs.row_count == 2 and jobs.display)
            row = next(
                r for r in range(2) if jobs.coordinate_to_cell_key((r, 0)).row_key.value == job.id
            )
            text = " ".join(str(getattr(c, "plain", c)) for c in jobs.get_row_at(row))
            assert "running" in text and "1.26k" in text and "675" in text and "▲1" in text
            # A click moves the cursor to the row; a click on the cursor's row opens it.
            for _ in range(2):
                if not isinstance(app.screen, JobDetailScreen):
                    await pilot.click(JobsTable, offset=(2, 1 + row))
                    await pilot.pause()
            await until(pilot, lambda: isinstance(app.screen, JobDetailScreen))
            screen = app.screen
            assert isinstance(screen, JobDetailScreen)
            await until(pilot, lambda: screen.view is not None)
            alerts = str(screen.query_one("#p-alerts", Panel).render())
            assert "rank 2 is a straggler" in alerts
            assert "backward" in str(screen.query_one("#p-breakdown", Panel).render())
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen))
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is screen)
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.main)

    asyncio.run(drive())


def test_cancel_and_drain_ask_first_and_act_through_the_coordinator(
    coordinator, sim: SimCluster
) -> None:  # type: ignore[no-untyped-def]
    job = populate(sim)
    notes: list[str] = []

    def hook(message: object) -> None:
        if isinstance(message, Notify):
            notes.append(message.notification.message)

    async def drive() -> None:
        app = HeteroTop(coordinator.address, period_s=PERIOD_S)
        async with app.run_test(size=(80, 24), message_hook=hook) as pilot:
            cluster = app.query_one(ClusterTable)
            await until(pilot, lambda: cluster.row_count == 4)
            cluster.focus()
            await pilot.press("d")  # cursor on cpu-c:0, the first row
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await until(pilot, lambda: "node cpu-c drained" in notes)
            await until(pilot, lambda: "drain" in _cells(cluster))  # "draining", narrow
            nodes = sim.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes
            assert {n.name for n in nodes if n.draining} == {"cpu-c"}

            await pilot.press("2")
            jobs = app.query_one(JobsTable)
            await until(pilot, lambda: jobs.row_count == 2)
            row = next(
                r for r in range(2) if jobs.coordinate_to_cell_key((r, 0)).row_key.value == job.id
            )
            jobs.move_cursor(row=row)
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("n")  # asked, declined: nothing happens
            await until(pilot, lambda: app.screen is app.main)
            assert sim.job(job.id).state == pb.JOB_STATE_RUNNING
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.click("#yes")  # the dialog's button, by mouse
            await until(pilot, lambda: "job resnet-mixed cancelled" in notes)
            assert sim.job(job.id).state == pb.JOB_STATE_CANCELLED
            await until(pilot, lambda: "cancelled" in _cells(jobs))

            app.open_job("no-such-job")
            await until(pilot, lambda: any("unknown job 'no-such-job'" in n for n in notes))

    asyncio.run(drive())


def test_a_coordinator_restart_shows_a_banner_until_it_reconnects(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"

    def start(address: str) -> tuple[object, int]:
        server, port = create_server(address, Settings(db_url=db))
        server.start()
        return server, port

    server, port = start("127.0.0.1:0")
    sim = SimCluster(f"127.0.0.1:{port}")
    sim.register()
    sim.heartbeat()

    async def drive() -> None:
        nonlocal server
        app = HeteroTop(f"127.0.0.1:{port}", period_s=PERIOD_S)
        async with app.run_test(size=(80, 24)) as pilot:
            banner = app.query_one(Banner)
            await until(pilot, lambda: app.query_one(ClusterTable).row_count == 4)
            assert not banner.shown
            server.stop(0).wait()  # type: ignore[attr-defined]
            await until(pilot, lambda: banner.shown)
            assert "DISCONNECTED" in str(banner.render())
            assert app.query_one(ClusterTable).row_count == 4, "the last state stays on screen"
            server, _ = start(f"127.0.0.1:{port}")
            # Reconnected: within its backoff (at most 5 s) and a loaded host's delays.
            await until(pilot, lambda: not banner.shown)

    try:
        asyncio.run(drive())
    finally:
        sim.close()
        server.stop(0).wait()  # type: ignore[attr-defined]


def test_node_fields_with_escape_sequences_are_shown_escaped(coordinator) -> None:  # type: ignore[no-untyped-def]
    """Issue 33: a node credential registered device names with OSC 52 and friends, and
    hetero-top wrote them raw (16 clipboard buffers filled with ``rm -rf ~``)."""
    from hetero.v1 import types_pb2 as tpb

    attack = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b?1049h"
    coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(
            name="evil",
            address="10.0.0.9",
            devices=[
                tpb.DeviceProfile(index=0, name="gpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
            ],
        ),
        timeout=5,
    )
    # The API refuses such names now (``coordinator.bounds``); a database an older
    # coordinator wrote may still hold them.
    with coordinator.engine.begin() as conn:
        conn.execute(text("UPDATE nodes SET address = :a"), {"a": f"10.0.0.9{attack}"})
        conn.execute(text("UPDATE devices SET name = :n"), {"n": f"{attack}gpu"})
    coordinator.restart()

    async def drive() -> None:
        app = HeteroTop(coordinator.address, period_s=PERIOD_S)
        async with app.run_test(size=(160, 30)) as pilot:
            cluster = app.query_one(ClusterTable)
            await until(pilot, lambda: cluster.row_count == 1)
            cells = _cells(cluster)
            controls = [c for cell in cells for c in cell if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0]
            assert controls == [], cells
            assert any(cell.startswith("\\x1b]52;c;") for cell in cells), cells

    asyncio.run(drive())


def test_a_snapshot_that_arrives_while_the_app_exits_is_dropped() -> None:
    """The watch worker may post a snapshot just before the app takes its screens down;
    Textual then handles it with no screen on the stack. It must not raise."""

    async def drive() -> HeteroTop:
        app = HeteroTop("127.0.0.1:1", watch=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
        return app

    app = asyncio.run(drive())
    assert not app.screen_stack
    app.on_snapshot_received(SnapshotReceived(ClusterState()))
    app.on_disconnected(Disconnected("unreachable", 1))
    assert app._connected_once  # the state is kept; only the drawing is skipped
