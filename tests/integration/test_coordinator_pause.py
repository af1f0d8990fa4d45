"""A stall is not a node loss (issue #33): a coordinator stopped for longer than the
heartbeat timeout (SIGSTOP, a suspended VM) heard no heartbeat meanwhile, through no
fault of its nodes. At resume it counts every node's silence from then, as after a
restart, and declares no node down; real agents keep their nodes up."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0


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
