"""The links between nodes are measured when a job spans them (issue #34), kept with both
nodes' host profiles, shown by ``hetero-coord nodes``, counted in a later job's
predictions, not measured again while fresh, and a report that makes no sense is
refused in one line.

The real coordinator on port 0 and two real agents (their links, order streams, probe
servers and measuring threads) in this process, on one host: node-a and node-b, one
CPU each, so a 2-rank job gets a rank on each. Only the hardware profile is given.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hetero.agent.config import AgentConfig
from hetero.agent.daemon import Agent
from hetero.agent.profile import DeviceMeasure, NodeProfile
from hetero.core.balancer import Link, link_comm_s
from hetero.core.catalogue import model
from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb
from tests.integration.conftest import Coordinator

pytestmark = pytest.mark.slow

NAMES = ("node-a", "node-b")
JOB = """\
name: {name}
command: ["/bin/true"]
global_batch: 8
steps: 1
resources: {{ranks: 2, device: cpu}}
"""
CLI = (sys.executable, "-m", "hetero.coordinator.cli")
BUILT_IN = "name: sized\nmodel: resnet18\nglobal_batch: 32\nresources: {ranks: 2, device: cpu}\n"


def _wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def agents(
    coordinator: Coordinator, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[dict[str, Agent]]:
    """node-a and node-b, their order streams open; ``request.param``: the names of those
    started with ``--no-peer-probe`` (none unless the test says)."""
    silent = getattr(request, "param", ())
    started: dict[str, Agent] = {}
    threads = []
    for name in NAMES:
        config = AgentConfig(
            coordinator=coordinator.address,
            name=name,
            address="127.0.0.1",
            local_listen="127.0.0.1:0",
            state_dir=tmp_path / name,
            peer_probe=name not in silent,
        )
        profile = NodeProfile("test cpu", 1, 10.0, 1 << 30, (DeviceMeasure(0, "cpu", "cpu", 1.0),))
        started[name] = agent = Agent(config, profile)
        threads.append(threading.Thread(target=agent.run, daemon=True))
        threads[-1].start()
    state = coordinator.server.service.state
    serving = lambda: sum(n.peer_probe is not None for n in state.nodes.values())  # noqa: E731
    expected = len(NAMES) - len(silent)
    _wait_for("the agents' order streams", lambda: coordinator.server.call(serving) == expected)
    try:
        yield started
    finally:
        for agent in started.values():
            agent.stop()
        for thread in threads:
            thread.join(timeout=30)


def _links(coordinator: Coordinator) -> dict[str, list[tpb.PeerLink]]:
    nodes = coordinator.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes
    return {n.name: list(n.host_profile.peer_links) for n in nodes}


def _run_job(coordinator: Coordinator, name: str) -> None:
    spec = JOB.format(name=name)
    job_id = coordinator.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=5).job_id
    job = coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5)
    assert {r.node_name for r in job.ranks} == set(NAMES), "one rank on each node"
    ended = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED)

    def done() -> bool:
        job = coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5)
        return job.state in ended

    _wait_for(f"job {name} to end", done)


def test_a_job_across_two_nodes_measures_their_link_once_and_later_jobs_count_it(
    coordinator: Coordinator, agents: dict[str, Agent]
) -> None:
    measured_at = coordinator.clock.now
    _run_job(coordinator, "first")
    links = _wait_for(
        "a link in both nodes' profiles",
        lambda: (x := _links(coordinator)) and all(x.values()) and x,
    )
    (a_to_b,), (b_to_a,) = links["node-a"], links["node-b"]
    assert (a_to_b.peer, b_to_a.peer) == ("node-b", "node-a")
    assert a_to_b.measured_at_unix_s == b_to_a.measured_at_unix_s == measured_at
    assert a_to_b.rtt_s == b_to_a.rtt_s > 0
    assert a_to_b.send_bytes_per_s == b_to_a.receive_bytes_per_s > 0, "one probe, both sides"
    assert [agents[n].peers.measured for n in NAMES] == [1, 0], "the first name measures"

    # hetero-coord nodes shows them, and never a probe's token.
    shown = subprocess.run(
        [*CLI, "nodes", "--json", "--coordinator", coordinator.address],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    listed = {n["name"]: n for n in json.loads(shown)["nodes"]}
    assert listed["node-a"]["host_profile"]["peer_links"][0]["peer"] == "node-b"
    for agent in agents.values():
        assert agent.peers.endpoint is not None
        _port, token = agent.peers.endpoint
        for form in (token.hex(), token.hex().upper(), base64.b64encode(token).decode()):
            assert form not in shown, "as JSON would carry bytes, or as hex"

    # A later job across the same nodes predicts its all-reduce over the link...
    dry = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=BUILT_IN, dry_run=True), timeout=5
    )
    slowest = [
        Link(min(x.send_bytes_per_s, x.receive_bytes_per_s), x.rtt_s) for x in (a_to_b, b_to_a)
    ]
    expected = link_comm_s(model("resnet18").parameters, 2, slowest)
    assert {p.policy: p.comm_s for p in dry.predictions} == {
        "equal": pytest.approx(expected),
        "proportional": pytest.approx(expected),
        "dynamic": pytest.approx(expected),
    }

    # ...and, the link fresh, does not measure it again.
    coordinator.clock.now += 2.0
    _run_job(coordinator, "second")
    asked = coordinator.server.call(lambda: dict(coordinator.server.service.cluster.link_asks))
    assert asked == {frozenset(NAMES): measured_at}, "not asked again"
    assert [agents[n].peers.measured for n in NAMES] == [1, 0]
    again = _links(coordinator)
    assert [x.measured_at_unix_s for n in NAMES for x in again[n]] == [measured_at] * 2


@pytest.mark.parametrize("agents", [("node-b",)], indirect=True)
def test_a_node_whose_agent_serves_no_probe_has_no_link_measured(
    coordinator: Coordinator, agents: dict[str, Agent]
) -> None:
    assert agents["node-b"].peers.endpoint is None
    _run_job(coordinator, "first")  # node-b's stream has opened, announcing no probe,
    _run_job(coordinator, "second")  # before this one is placed
    asked = coordinator.server.call(lambda: dict(coordinator.server.service.cluster.link_asks))
    assert asked == {} and _links(coordinator) == {"node-a": [], "node-b": []}
    assert [agents[n].peers.measured for n in NAMES] == [0, 0]


def test_a_probe_port_another_process_holds_stops_the_agent_in_one_line(tmp_path: Path) -> None:
    with socket.create_server(("0.0.0.0", 0)) as held:
        port = held.getsockname()[1]
        config = AgentConfig(state_dir=tmp_path, local_listen="127.0.0.1:0", peer_probe_port=port)
        profile = NodeProfile("test cpu", 1, 10.0, 1 << 30, (DeviceMeasure(0, "cpu", "cpu", 1.0),))
        with pytest.raises(ConfigError) as err:
            Agent(config, profile)
    assert str(err.value).startswith(f"peer_probe_port {port}: cannot listen (")
    assert "\n" not in str(err.value)


def _register(coordinator: Coordinator, name: str) -> str:
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    request = pb.RegisterNodeRequest(name=name, address="10.0.0.1", devices=[device])
    return coordinator.stub.RegisterNode(request, timeout=5).node_id


@pytest.mark.parametrize(
    ("link", "said"),
    [
        (
            tpb.PeerLink(peer="n2", rtt_s=float("nan")),
            "ReportPeerLinks: links[0].rtt_s: must be a finite number, got nan",
        ),
        (
            tpb.PeerLink(peer="n2", rtt_s=1e-4, send_bytes_per_s=1e9),
            "ReportPeerLinks: links[0].peer: node n1 was not asked to measure a link to 'n2'",
        ),
        (
            tpb.PeerLink(peer="elsewhere", rtt_s=1e-4),
            "ReportPeerLinks: links[0].peer: node n1 was not asked to measure a link to "
            "'elsewhere'",
        ),
    ],
)
def test_a_link_report_that_makes_no_sense_is_refused_in_one_line(
    coordinator: Coordinator, link: tpb.PeerLink, said: str
) -> None:
    node_id = _register(coordinator, "n1")
    _register(coordinator, "n2")
    request = pb.ReportPeerLinksRequest(node_id=node_id, links=[link])
    with pytest.raises(grpc.RpcError) as err:
        coordinator.stub.ReportPeerLinks(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == said
    assert not any(_links(coordinator).values()), "nothing kept"
