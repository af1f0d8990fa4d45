"""The shared cluster snapshot (``coordinator.snapshots``), as ``hetero-coord serve`` wires
it: built in a worker process with its own database engine, handed the telemetry
still in the ingest's memory, shared by every ``WatchCluster`` stream, built here
when the worker dies. Real gRPC, a real worker process, SQLite files, then
PostgreSQL."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from hetero.bench.loadgen import device_profiles, heartbeat_request
from hetero.coordinator.database import open_database, read_session_factory, session_factory
from hetero.coordinator.ingest import HeartbeatIngest
from hetero.coordinator.server import create_server
from hetero.coordinator.service import Deps
from hetero.coordinator.snapshots import NICE, Snapshots, SnapshotWorker, builder
from hetero.coordinator.store import TelemetryPolicy
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

#: Generous: the first build waits for the worker to start (a spawn imports hetero; seconds
#: on a loaded 2-core runner).
DEADLINE_S = 60.0


@dataclass
class Served:
    stub: pb_grpc.CoordinatorStub
    deps: Deps
    snapshots: Snapshots
    ingest: HeartbeatIngest
    worker: SnapshotWorker
    #: A build with the worker given (None: here).
    build: Callable[[SnapshotWorker | None], bytes]


@pytest.fixture
def served(both_stores_url: str) -> Iterator[Served]:
    """A coordinator whose snapshots are built in a worker and kept an hour; the ingest's
    flusher is not started, so telemetry stays in memory."""
    engine = open_database(both_stores_url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    ingest = HeartbeatIngest(sessions, readers, TelemetryPolicy(period_s=10.0))
    worker = SnapshotWorker(both_stores_url)
    now = 1_700_000_000.0

    def clock() -> float:
        return now

    def build(with_worker: SnapshotWorker | None) -> bytes:
        return builder(
            readers, ingest=ingest, clock=clock, heartbeat_timeout_s=10.0, worker=with_worker
        )()

    snapshots = Snapshots(lambda: build(worker), ttl_s=3600.0)
    deps = Deps(sessions=sessions, readers=readers, ingest=ingest, snapshots=snapshots, clock=clock)
    server, port = create_server("127.0.0.1:0", deps)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(pb_grpc.CoordinatorStub(channel), deps, snapshots, ingest, worker, build)
    finally:
        channel.close()
        server.stop(0).wait()
        worker.close()
        engine.dispose()


def _register_and_beat(stub: pb_grpc.CoordinatorStub, names: list[str]) -> None:
    for name in names:
        req = pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=device_profiles(2))
        node = stub.RegisterNode(req, timeout=DEADLINE_S).node_id
        stub.Heartbeat(heartbeat_request(node, 2, tick=1), timeout=DEADLINE_S)


def test_a_snapshot_built_in_the_worker_is_the_one_built_here_unwritten_telemetry_included(
    served: Served,
) -> None:
    _register_and_beat(served.stub, ["n1", "n2"])
    there = served.snapshots.message()
    assert served.worker.answered == 1
    (pid,) = served.worker.pids()
    assert pid != os.getpid()
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(ours + NICE, 19), "niced"
    # Nothing was flushed: the devices' telemetry came over from the ingest's memory.
    assert {n.name: [t.device_index for t in n.telemetry] for n in there.nodes} == {
        "n1": [0, 1],
        "n2": [0, 1],
    }
    assert there == pb.ClusterSnapshot.FromString(served.build(None))


def test_every_watcher_gets_the_one_shared_snapshot(served: Served) -> None:
    _register_and_beat(served.stub, ["n1"])
    streams = [
        served.stub.WatchCluster(pb.WatchClusterRequest(period_s=0.2), timeout=DEADLINE_S)
        for _ in range(3)
    ]
    try:
        firsts = [next(stream) for stream in streams]
        seconds = [next(stream) for stream in streams]
    finally:
        for stream in streams:
            stream.cancel()
    assert all(s == firsts[0] for s in firsts + seconds)
    assert [n.name for n in firsts[0].nodes] == ["n1"]
    assert served.snapshots.builds == 1


def test_a_killed_worker_is_replaced_and_that_build_done_here(served: Served) -> None:
    _register_and_beat(served.stub, ["n1"])
    assert served.build(served.worker) and served.worker.answered == 1
    (pid,) = served.worker.pids()
    os.kill(pid, signal.SIGKILL)
    # The next build finds the worker dead: that one is built here, and logged.
    built = pb.ClusterSnapshot.FromString(served.build(served.worker))
    assert served.worker.fallbacks == 1 and served.worker.answered == 1
    assert [n.name for n in built.nodes] == ["n1"]
    # The one after starts another worker and is built there.
    assert served.build(served.worker) and served.worker.answered == 2
    assert served.worker.pids() and served.worker.pids() != [pid]


def test_a_worker_started_ahead_is_ready_before_the_first_build(served: Served) -> None:
    served.worker.start()
    assert served.worker.wait_ready(60.0) and served.worker.pids()
    assert served.worker.answered == 0 and served.worker.fallbacks == 0
    served.build(served.worker)
    assert served.worker.answered == 1 and served.worker.fallbacks == 0
