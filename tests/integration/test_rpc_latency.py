"""The coordinator's own time per call (``hetero_rpc_duration_seconds``), over real gRPC,
SQLite and HTTP: every call counted once, by method and status code, and served by
``/metrics`` as the module ``metricsserver`` bounds it."""

from __future__ import annotations

import re
import time
import urllib.request

import grpc
import pytest
from prometheus_client.registry import CollectorRegistry
from simcluster import watch_orders

from hetero.bench.loadgen import device_profiles, heartbeat_request
from hetero.coordinator.metrics import BUCKETS_S, NAME
from hetero.v1 import coordinator_pb2 as pb

DEADLINE_S = 5.0


def sample(
    registry: CollectorRegistry, suffix: str, method: str, code: str, le: str | None = None
) -> float:
    labels = {"method": method, "code": code} | ({"le": le} if le is not None else {})
    value = registry.get_sample_value(NAME + suffix, labels)
    return 0.0 if value is None else value


def test_every_call_is_counted_once_by_method_and_status(coordinator) -> None:  # type: ignore[no-untyped-def]
    stub, latency = coordinator.stub, coordinator.server.registry
    nodes = [
        stub.RegisterNode(
            pb.RegisterNodeRequest(name=f"n{i}", address=f"n{i}.local", devices=device_profiles(1)),
            timeout=DEADLINE_S,
        ).node_id
        for i in range(3)
    ]
    for tick in range(1, 6):
        for node in nodes:
            stub.Heartbeat(heartbeat_request(node, 1, tick), timeout=DEADLINE_S)
    for node in nodes:
        watch_orders(stub, node)
    stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S)
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Heartbeat(heartbeat_request("no-such-node", 1, 1), timeout=DEADLINE_S)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert sample(latency, "_count", "RegisterNode", "OK") == 3
    assert sample(latency, "_count", "Heartbeat", "OK") == 15
    assert sample(latency, "_count", "ListNodes", "OK") == 1
    assert sample(latency, "_count", "Heartbeat", "NOT_FOUND") == 2
    assert sample(latency, "_count", "GetPlan", "OK") == 0, "no call, no series"
    # The buckets are cumulative and end in +Inf, which holds every call.
    counts = [sample(latency, "_bucket", "Heartbeat", "OK", str(le)) for le in BUCKETS_S]
    assert counts == sorted(counts)
    assert sample(latency, "_bucket", "Heartbeat", "OK", "+Inf") == 15
    assert sample(latency, "_sum", "Heartbeat", "OK") > 0


def _scrape(port: int, query: str = "") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics{query}", timeout=10) as resp:
        return str(resp.read().decode())


def _heartbeats_in(text: str) -> float | None:
    found = re.search(rf'^{NAME}_count{{code="OK",method="Heartbeat"}} (\S+)$', text, re.M)
    return None if found is None else float(found.group(1))


def test_a_scrape_is_built_at_most_once_a_second_and_a_filter_collects_what_it_names(
    coordinator, sim
) -> None:  # type: ignore[no-untyped-def]
    sim.register()
    sim.heartbeat()
    port = coordinator.server.serve_metrics("127.0.0.1:0")
    server = coordinator.server.metrics
    text = _scrape(port)
    assert f"# TYPE {NAME} histogram" in text
    assert 'hetero_nodes{state="up"} 3.0' in text
    assert _heartbeats_in(text) == 3
    assert re.search(
        rf'^{NAME}_bucket{{code="OK",le="\+Inf",method="RegisterNode"}} 3\.0$', text, re.M
    )
    for _ in range(4):
        sim.heartbeat()
    # Within TTL_S of the first build a scrape gets the same bytes; then new ones.
    deadline = time.monotonic() + 10.0
    while (seen := _heartbeats_in(_scrape(port))) != 15:
        assert seen == 3 and time.monotonic() < deadline, seen
        time.sleep(0.1)
    assert server.builds == 2
    # ?name[]= of the histogram's samples only: the cluster is not collected.
    count = f"?name[]={NAME}_count&name%5B%5D={NAME}_sum"
    only = _scrape(port, count)
    assert _heartbeats_in(only) == 15
    assert f"{NAME}_sum{{" in only
    assert "_bucket" not in only and "hetero_nodes" not in only
    both = _scrape(port, f"{count}&name[]=hetero_nodes")
    assert 'hetero_nodes{state="up"} 3.0' in both and _heartbeats_in(both) == 15
    assert f"{NAME}_bucket" not in both
