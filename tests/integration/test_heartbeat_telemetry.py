"""Heartbeats and the telemetry they carry, over real gRPC and a real SQLite file, then
PostgreSQL: answered from memory, telemetry written once per bucket (the first sample of
each, all nodes' together) and pruned past its retention, an agent's buffered samples
each in the bucket they were sampled in, and read sessions that cannot write."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from conftest import Coordinator, hand_clocked, start_coordinator
from handclock import Clock
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from hetero.bench.loadgen import device_profiles, heartbeat_request
from hetero.coordinator.database import read_session_factory
from hetero.coordinator.store import TelemetryPolicy
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0


@pytest.fixture
def served(both_stores_url: str) -> Iterator[Coordinator]:
    """A coordinator keeping telemetry in buckets of 10 s for 60 s."""
    clock = Clock()
    policy = TelemetryPolicy(period_s=10.0, retention_s=60.0)
    c = start_coordinator(hand_clocked(both_stores_url, clock, telemetry=policy), clock)
    try:
        yield c
    finally:
        c.channel.close()
        c.server.stop(0).wait()


def _register(c: Coordinator, name: str) -> str:
    req = pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=device_profiles(2))
    return str(c.stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _host_beat(node: str, cpu: float, sampled_at: float | None = None) -> pb.HeartbeatRequest:
    req = pb.HeartbeatRequest(node_id=node, host=tpb.HostTelemetry(cpu_percent=cpu))
    if sampled_at is not None:
        req.sampled_at_unix_s = sampled_at
    return req


def _rows(c: Coordinator, sql: str) -> list[tuple[object, ...]]:
    c.flush()
    with c.engine.connect() as db:
        return [tuple(r) for r in db.execute(text(sql)).all()]


def test_telemetry_is_written_once_a_bucket_and_dropped_past_its_retention(
    served: Coordinator,
) -> None:
    node = _register(served, "n1")
    first = int(served.clock.now // 10) + 1
    served.clock.now = first * 10.0 + 1  # one second into a bucket
    for cpu in (10.0, 20.0, 30.0):  # three beats in one bucket: its first is written
        served.stub.Heartbeat(_host_beat(node, cpu), timeout=DEADLINE_S)
        (n1,) = served.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
        assert n1.host.cpu_percent == cpu and n1.last_heartbeat_unix_s == served.clock.now
        served.clock.now += 2
    assert _rows(served, "SELECT bucket, cpu_percent FROM telemetry") == [(first, 10.0)]
    served.clock.now = (first + 1) * 10.0
    served.stub.Heartbeat(heartbeat_request(node, 2, tick=1), timeout=DEADLINE_S)
    counts = "SELECT bucket, count(*) FROM telemetry GROUP BY bucket ORDER BY bucket"
    assert _rows(served, counts) == [(first, 1), (first + 1, 3)], "the host and each device"
    served.clock.now += 120  # past the retention: old rows go at the pruner's pass
    served.stub.Heartbeat(_host_beat(node, 50.0), timeout=DEADLINE_S)
    served.server.run(served.server.service.prune())
    assert _rows(served, "SELECT cpu_percent FROM telemetry") == [(50.0,)]


def test_a_burst_of_buffered_telemetry_keeps_a_sample_per_bucket_it_was_sampled_in(
    served: Coordinator,
) -> None:
    """After a coordinator outage an agent sends what it buffered, oldest first."""
    node = _register(served, "n1")
    served.clock.now += 5
    now = served.clock.now
    served.stub.Heartbeat(_host_beat(node, 50.0), timeout=DEADLINE_S)
    # Three buffered samples in three older buckets, a second one of the same bucket (not
    # kept), one beyond retention (dropped), one of the live bucket (it has its sample).
    for cpu, age in ((9.0, 90.0), (1.0, 35.0), (1.5, 34.0), (2.0, 25.0), (3.0, 15.0), (7.0, 0.5)):
        served.stub.Heartbeat(_host_beat(node, cpu, sampled_at=now - age), timeout=DEADLINE_S)
    rows = _rows(served, "SELECT time_unix_s, cpu_percent FROM telemetry ORDER BY time_unix_s")
    assert rows == [(now - 35.0, 1.0), (now - 25.0, 2.0), (now - 15.0, 3.0), (now, 50.0)]
    (n1,) = served.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
    assert n1.host.cpu_percent == 50.0, "the live sample, not a buffered one"


def test_a_heartbeat_of_an_unknown_node_is_refused_at_once(served: Coordinator) -> None:
    with pytest.raises(grpc.RpcError) as info:
        served.stub.Heartbeat(_host_beat("0" * 12, 1.0), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "register first" in (info.value.details() or "")


def test_read_sessions_cannot_write(served: Coordinator) -> None:
    readers = read_session_factory(served.engine)
    # SQLite: "attempt to write a readonly database"; PostgreSQL: "cannot execute UPDATE
    # in a read-only transaction".
    with readers() as s, pytest.raises(DBAPIError, match=r"read-?only"):
        s.execute(text("UPDATE nodes SET draining = true"))
