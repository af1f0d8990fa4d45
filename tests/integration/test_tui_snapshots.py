"""SVG snapshots of every hetero-top screen at 80x24 and 200x50, compared with the
committed screenshots in docs/tui/ (they double as the documentation's pictures).

The data is real: a coordinator with a fixed clock, fed by the simulated
cluster; random ids are then replaced by fixed ones, so every run renders the
same pixels. After an intended change of the UI, regenerate with
``HETERO_UPDATE_SNAPSHOTS=1 pytest tests/integration/test_tui_snapshots.py``
and look at the new SVGs before committing them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from conftest import hand_clocked
from google.protobuf import text_format
from simcluster import SMALL_JOB_SPEC, SimCluster

from hetero.coordinator.server import create_server
from hetero.tui.app import HeteroTop, SnapshotReceived
from hetero.tui.detail import detail_view
from hetero.tui.screens import HelpScreen, JobDetailScreen
from hetero.tui.state import ClusterState
from hetero.v1 import coordinator_pb2 as pb

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tui"
SIZES = ((80, 24), (200, 50))
SCREENS = ("cluster", "jobs", "detail", "help")
UPDATE = os.environ.get("HETERO_UPDATE_SNAPSHOTS") == "1"
M = TypeVar("M", pb.ClusterSnapshot, pb.JobDetail)
#: A job that waits: every CUDA device runs a rank of the 3-rank job.
QUEUED_JOB_SPEC = SMALL_JOB_SPEC.replace("cpu-smoke", "gpu-wait").replace(
    "device: cpu", "device: cuda"
)


@dataclass(frozen=True)
class Scene:
    state: ClusterState
    detail: pb.JobDetail
    job_id: str


class FixedClock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0  # 2026-01-01 00:00 UTC

    def __call__(self) -> float:
        return self.now


def _fixed_ids(snapshot: pb.ClusterSnapshot) -> dict[str, str]:
    """The coordinator's random node and job ids, each with a fixed stand-in."""
    ids = {n.id: f"node-{n.name}" for n in snapshot.nodes}
    return ids | {j.id: f"job-{j.name}"[:12] for j in snapshot.jobs}


def _renamed(msg: M, ids: dict[str, str]) -> M:
    text = text_format.MessageToString(msg)
    for old, new in ids.items():
        text = text.replace(old, new)
    return text_format.Parse(text, type(msg)())


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """A cluster 30 s into a run: a 3-rank job re-planned around an emulated straggler,
    a pending job, a job queued for a CUDA device (the 3-rank job holds all three),
    node gpu-b drained and node cpu-c silent for 15 s (down)."""
    db = tmp_path_factory.mktemp("snap") / "coordinator.db"
    clock = FixedClock()
    server, port = create_server("127.0.0.1:0", hand_clocked(f"sqlite:///{db}", clock))
    server.start()
    sim = SimCluster(f"127.0.0.1:{port}")
    snapshots = []
    try:
        sim.register()
        for tick in range(30):
            clock.now += 1.0
            sim.heartbeat(skip=("cpu-c",) if tick >= 15 else ())
            if tick == 3:
                job = sim.submit()
                sim.start(job)
                clock.now += 1.0
                sim.submit(SMALL_JOB_SPEC)
                clock.now += 1.0
                sim.submit(QUEUED_JOB_SPEC)
            if tick > 3 and tick % 2 == 0:
                sim.train(sim.job(job.id), 1)
            if tick == 20:
                sim.stub.DrainNode(pb.DrainNodeRequest(node="gpu-b"), timeout=5)
            snapshots.append(server.snapshot())
        detail = sim.stub.GetJobDetail(pb.GetJobDetailRequest(job_id=job.id), timeout=5)
    finally:
        sim.close()
        server.stop(0).wait()
    ids = _fixed_ids(snapshots[-1])
    state = ClusterState()
    for snap in snapshots:
        snap = _renamed(snap, ids)
        # The jobs were submitted within seconds; keep their order independent of ids.
        jobs = sorted(snap.jobs, key=lambda j: j.name, reverse=True)
        del snap.jobs[:]
        snap.jobs.extend(jobs)
        state = state.advance(snap)
    yield Scene(state, _renamed(detail, ids), ids[job.id])


async def _screenshot(scene: Scene, screen: str, size: tuple[int, int]) -> str:
    app = HeteroTop("coordinator:7070", watch=False)
    async with app.run_test(size=size) as pilot:
        app.animation_level = "none"
        app.post_message(SnapshotReceived(scene.state))
        await pilot.pause()
        if screen == "jobs":
            await pilot.press("2")
        elif screen == "detail":
            detail = JobDetailScreen(scene.job_id, poll=False)
            await app.push_screen(detail)
            detail.show(detail_view(scene.detail))
        elif screen == "help":
            await app.push_screen(HelpScreen())
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        return app.export_screenshot(title=f"hetero-top: {screen}")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_screens_match_the_committed_screenshots(
    scene: Scene, size: tuple[int, int], tmp_path: Path
) -> None:
    mismatched = []
    for screen in SCREENS:
        svg = asyncio.run(_screenshot(scene, screen, size))
        path = DOCS / f"{screen}-{size[0]}x{size[1]}.svg"
        if UPDATE:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(svg, encoding="utf-8")
            continue
        if not path.is_file() or path.read_text(encoding="utf-8") != svg:
            (tmp_path / path.name).write_text(svg, encoding="utf-8")
            mismatched.append(path.name)
    assert not mismatched, (
        f"{mismatched} differ from docs/tui/ (new renders in {tmp_path}); if the change is "
        "intended: HETERO_UPDATE_SNAPSHOTS=1 pytest tests/integration/test_tui_snapshots.py"
    )
