"""A stall is not a node loss (issue #33): a coordinator stopped for longer than the
heartbeat timeout (SIGSTOP, a suspended VM) heard no heartbeat meanwhile, through no
fault of its nodes. At resume it counts every node's silence from then, as after a
restart, and declares no node down; real agents keep their nodes up."""

from __future__ import annotations

import logging
import signal
import sqlite3
import time
from pathlib import Path

import grpc
import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.coordinator.server import Settings, create_server
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
#: The slow-database test's: a loop stall counts as a pause from 1.5 s, which a loaded
#: two-core host does not reach.
SLOW_INTERVAL_S, SLOW_TIMEOUT_S = 1.5, 4.0


def test_a_paused_coordinator_declares_no_node_down_when_it_resumes(tmp_path: Path) -> None:
    agents = [AgentSpec("node-a"), AgentSpec("node-b")]
    with LocalCluster(
        tmp_path / "cluster", agents, heartbeat_timeout_s=TIMEOUT_S, heartbeat_interval_s=0.5
    ) as cluster:
        coordinator = cluster.procs["coordinator"]
        coordinator.send_signal(signal.SIGSTOP)
        time.sleep(2 * TIMEOUT_S)
        coordinator.send_signal(signal.SIGCONT)
        time.sleep(TIMEOUT_S)  # past the timeout again: nodes that beat are up
        nodes = cluster.stub.ListNodes(pb.ListNodesRequest(), timeout=10).nodes
        log = (tmp_path / "cluster" / "coordinator.log").read_text()
    assert "the coordinator was paused for" in log, log[-2000:]
    assert "down: no heartbeat" not in log, log[-2000:]
    assert sorted(n.name for n in nodes if n.healthy) == ["node-a", "node-b"]


def _register(stub: pb_grpc.CoordinatorStub, name: str) -> None:
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    stub.RegisterNode(
        pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=[device]), timeout=10
    )


def test_a_slow_database_is_not_a_pause_and_delays_no_node_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sweep that marks a node down waits for its commit; a database that takes
    seconds to commit it (here: another connection holds SQLite's write lock) is no
    stall of the coordinator, which heard heartbeats all along. A node that fell silent
    meanwhile is declared down at the next sweep, not a heartbeat timeout later."""
    db = tmp_path / "c.db"
    settings = Settings(
        db_url=f"sqlite:///{db}",
        heartbeat_interval_s=SLOW_INTERVAL_S,
        heartbeat_timeout_s=SLOW_TIMEOUT_S,
    )
    server, port = create_server("127.0.0.1:0", settings)
    caplog.set_level(logging.WARNING, logger="hetero.coordinator")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            start = time.monotonic()
            _register(stub, "early")  # silent from the start: down at SLOW_TIMEOUT_S
            time.sleep(1.0)
            _register(stub, "later")  # down at 1 + SLOW_TIMEOUT_S, while the writer waits
            holder = sqlite3.connect(db, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # the writer now waits (busy_timeout)
            # Held until 3 s past "early"'s loss: the sweep that marked it down waited
            # 2.25-3 s for its commit, more than a heartbeat interval.
            time.sleep(max(0.0, start + SLOW_TIMEOUT_S + 3.0 - time.monotonic()))
            holder.execute("ROLLBACK")
            holder.close()
            released = time.monotonic()
            # The sweeper, its commit done, comes back within 0.75 s: "later" goes down
            # then. Counting the wait as a pause would restart every silence: 4 s more.
            while not _logged(caplog, "node later down"):
                assert time.monotonic() - released < SLOW_TIMEOUT_S - 1.0, "node later not down"
                time.sleep(0.1)
    finally:
        server.stop(0).wait()
    assert _logged(caplog, "node early down")
    assert not _logged(caplog, "was paused")


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)
