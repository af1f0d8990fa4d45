"""The coordinator's own time per call (``hetero_rpc_duration_seconds``), over real gRPC,
SQLite and HTTP: every call counted once, by method and status code, and in every
``/metrics`` scrape."""

from __future__ import annotations

import re
import time
import urllib.request

import grpc
import pytest
from simcluster import watch_orders

from hetero.bench.loadgen import device_profiles, heartbeat_request
from hetero.coordinator.metricsserver import MetricsServer
from hetero.coordinator.rpclatency import BUCKETS_S, NAME, RpcLatency
from hetero.v1 import coordinator_pb2 as pb

DEADLINE_S = 5.0


def sample(
    latency: RpcLatency, suffix: str, method: str, code: str, le: str | None = None
) -> float:
    labels = {"method": method, "code": code} | ({"le": le} if le is not None else {})
    value = latency.registry.get_sample_value(NAME + suffix, labels)
    return 0.0 if value is None else value


def test_every_call_is_counted_once_by_method_and_status(coordinator) -> None:  # type: ignore[no-untyped-def]
    stub, latency = coordinator.stub, coordinator.server.latency
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


def test_the_histogram_follows_the_snapshot_in_every_scrape(coordinator, sim) -> None:  # type: ignore[no-untyped-def]
    sim.register()
    sim.heartbeat()
    served = coordinator.server
    # A snapshot kept for an hour: the histogram is current however old the snapshot.
    server = MetricsServer("127.0.0.1:0", served.snapshot, ttl_s=3600.0, rpc_latency=served.latency)
    server.start()
    try:
        text = _scrape(server.port)
        assert f"# TYPE {NAME} histogram" in text
        assert 'hetero_node_up{node="gpu-a"} 1.0' in text
        assert _heartbeats_in(text) == 3
        assert re.search(
            rf'^{NAME}_bucket{{code="OK",le="\+Inf",method="RegisterNode"}} 3\.0$', text, re.M
        )
        for _ in range(4):
            sim.heartbeat()
        # The HTTP process asks for the counts again at most every REFRESH_S.
        deadline = time.monotonic() + 10.0
        while (seen := _heartbeats_in(_scrape(server.port))) != 15:
            assert seen == 3 and time.monotonic() < deadline, seen
            time.sleep(0.1)
        assert server.snapshots.builds == 1
        # ?name[]= of the histogram's samples only: the snapshot is not read.
        server.snapshots.builds = 0
        count = f"?name[]={NAME}_count&name%5B%5D={NAME}_sum"
        only = _scrape(server.port, count)
        assert _heartbeats_in(only) == 15
        assert f"{NAME}_sum{{" in only
        assert "_bucket" not in only and "hetero_node_up" not in only
        assert server.snapshots.builds == 0
        # A name beyond the histogram gets the whole exposition.
        whole = _scrape(server.port, f"{count}&name[]=hetero_node_up")
        assert 'hetero_node_up{node="gpu-a"} 1.0' in whole and _heartbeats_in(whole) == 15
        assert "hetero_device_info" in whole and f"{NAME}_bucket" in whole
    finally:
        server.stop()
