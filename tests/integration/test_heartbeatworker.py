"""The heartbeat flush written in a process of its own (``coordinator.heartbeatworker``),
through the real Heartbeat RPC on a SQLite file and on PostgreSQL (``both_stores_url``):
the worker writes what the coordinator's thread would (liveness, a closed bucket's
newest sample, a down node marked up and the admission pass told, a deleted node
dropped), the sweeper's flush first still keeps a live node up, a killed worker
degrades to the coordinator's thread with a log line and is replaced, ``stop``'s
last flush lands in the worker, a small flush starts no worker, and ``hetero-coord
serve`` starts the worker for a cluster's flushes and ends it after writing
everything when it stops."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from handclock import Clock
from servedprocess import START_S, has_database_open, kill_left, serve, still_running, wait_for_line
from sqlalchemy import create_engine, text

from hetero.bench.loadgen import device_profiles, heartbeat_request
from hetero.coordinator import store
from hetero.coordinator.capacity import CapacityWatch
from hetero.coordinator.database import open_database, read_session_factory, session_factory
from hetero.coordinator.heartbeatworker import MIN_BEATS, HeartbeatWorker
from hetero.coordinator.ingest import HeartbeatIngest
from hetero.coordinator.models import NodeRow
from hetero.coordinator.recovery import Sweeper
from hetero.coordinator.server import create_server
from hetero.coordinator.service import Deps
from hetero.coordinator.store import TelemetryPolicy
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 10.0


@dataclass
class Served:
    stub: pb_grpc.CoordinatorStub
    deps: Deps
    ingest: HeartbeatIngest
    worker: HeartbeatWorker
    capacity: CapacityWatch
    clock: Clock


@pytest.fixture
def served(both_stores_url: str) -> Iterator[Served]:
    """``server.serve``'s wiring of the ingest and its worker, with a hand-moved clock;
    the flusher is not started (each test flushes when it wants the writes) and the
    worker takes every flush (``min_beats=1``)."""
    engine = open_database(both_stores_url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    policy = TelemetryPolicy(period_s=10.0, retention_s=600.0)
    capacity = CapacityWatch(sessions)
    # A generous limit: a loaded test box must not turn a slow flush into a fallback.
    worker = HeartbeatWorker(both_stores_url, capacity.changed, timeout_s=60.0, min_beats=1)
    ingest = HeartbeatIngest(sessions, readers, policy, worker=worker)
    clock = Clock()
    deps = Deps(
        sessions=sessions,
        readers=readers,
        ingest=ingest,
        capacity=capacity,
        telemetry=policy,
        clock=clock,
    )
    server, port = create_server("127.0.0.1:0", deps)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(pb_grpc.CoordinatorStub(channel), deps, ingest, worker, capacity, clock)
    finally:
        channel.close()
        server.stop(0).wait()
        worker.close()
        capacity.close()
        engine.dispose()


def _register(stub: pb_grpc.CoordinatorStub, name: str) -> str:
    req = pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=device_profiles(2))
    return str(stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _host_beat(node: str, cpu: float) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(node_id=node, host=tpb.HostTelemetry(cpu_percent=cpu))


def _start_worker(served: Served, node: str) -> None:
    """The first flush starts the worker (written here meanwhile); wait until it is up."""
    served.stub.Heartbeat(_host_beat(node, 1.0), timeout=DEADLINE_S)
    assert served.ingest.flush() == 1
    assert served.worker.answered == 0
    assert served.worker.wait_ready(60.0), "the heartbeat worker did not start"


def _heard(served: Served, node: str) -> tuple[float, bool]:
    with served.deps.sessions() as s:
        row = store.get_node(s, node)
        return row.last_heartbeat_unix_s, row.down


def _telemetry(served: Served, node: str) -> list[tuple[int, int | None, float | None]]:
    with served.deps.sessions() as s:
        rows = s.execute(
            text(
                "SELECT bucket, device_index, cpu_percent FROM telemetry WHERE node_id = :n "
                "ORDER BY bucket, device_index"
            ),
            {"n": node},
        )
        return [(int(b), d, c) for b, d, c in rows]


def test_the_worker_writes_liveness_and_closed_buckets_as_the_coordinator_would(
    served: Served,
) -> None:
    stub, clock, worker = served.stub, served.clock, served.worker
    node = _register(stub, "n1")
    _start_worker(served, node)
    assert worker.pids() and os.getpid() not in worker.pids()
    first = int(clock.now // 10)
    for cpu in (10.0, 20.0):  # two beats of one bucket, two flushes in the worker
        clock.now += 1
        stub.Heartbeat(_host_beat(node, cpu), timeout=DEADLINE_S)
        assert served.ingest.flush() == 1
        assert _heard(served, node) == (clock.now, False)
        assert _telemetry(served, node) == []  # the bucket is still open: from memory
        assert (current := served.ingest.current(node)) is not None
        assert current[None].cpu_percent == cpu
    assert worker.answered == 2
    # The bucket closed; its newest sample is written at the node's turn in the next
    # period, from the request it was parked with.
    clock.now = (first + 2) * 10.0 + 9.99
    stub.Heartbeat(heartbeat_request(node, 2, tick=3), timeout=DEADLINE_S)
    served.ingest.flush()
    assert _telemetry(served, node) == [(first, None, 20.0)]
    assert worker.answered == 3 and worker.fallbacks == 0
    assert (served.ingest.flushes, served.ingest.written) == (4, 5)  # 4 liveness, 1 sample


def test_a_down_node_heard_again_is_marked_up_by_the_worker_and_the_admission_pass_told(
    served: Served,
) -> None:
    stub, clock = served.stub, served.clock
    node = _register(stub, "n1")
    _start_worker(served, node)
    with served.deps.sessions.begin() as s:
        store.mark_down(s, store.get_node(s, node), 11.0, now=clock.now)
    epoch = served.capacity.due(clock.now)
    assert epoch is not None
    served.capacity.passed(epoch, clock.now)
    assert served.capacity.due(clock.now) is None
    clock.now += 1
    stub.Heartbeat(_host_beat(node, 5.0), timeout=DEADLINE_S)
    answered = served.worker.answered
    served.ingest.flush()
    assert served.worker.answered == answered + 1
    assert _heard(served, node) == (clock.now, False)
    with served.deps.sessions() as s:
        kinds = s.execute(text("SELECT kind FROM events WHERE node_id = :n"), {"n": node})
        assert [k for k in kinds.scalars() if k in ("node_down", "node_up")] == [
            "node_down",
            "node_up",
        ]
    # The coordinator's sessions never saw that write: the worker's reply told the watch.
    assert served.capacity.due(clock.now) is not None, "the admission pass was not told"
    # A flush that marks nobody up tells nothing.
    served.capacity.passed(served.capacity.epoch, clock.now)
    stub.Heartbeat(_host_beat(node, 6.0), timeout=DEADLINE_S)
    served.ingest.flush()
    assert served.capacity.due(clock.now) is None


def test_a_node_deleted_while_parked_is_dropped_by_the_flush_in_the_worker(
    served: Served,
) -> None:
    stub, clock = served.stub, served.clock
    kept, deleted = _register(stub, "kept"), _register(stub, "deleted")
    _start_worker(served, kept)
    clock.now += 1
    for node in (kept, deleted):
        stub.Heartbeat(_host_beat(node, 7.0), timeout=DEADLINE_S)
    assert served.ingest.is_known(deleted)
    with served.deps.sessions.begin() as s:
        s.delete(s.get(NodeRow, deleted))
    written = served.ingest.written
    assert served.ingest.flush(everything=True) == 4  # two nodes heard, two samples
    assert served.ingest.written == written + 2  # the deleted node's two left out
    assert not served.ingest.is_known(deleted) and served.ingest.current(deleted) is None
    assert served.ingest.is_known(kept)
    assert _heard(served, kept)[0] == clock.now
    assert served.worker.fallbacks == 0
    # Its agent's next heartbeat is refused at once: it registers again.
    with pytest.raises(grpc.RpcError) as info:
        stub.Heartbeat(_host_beat(deleted, 8.0), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_sweeper_flushes_through_the_worker_before_it_looks_for_silent_nodes(
    served: Served,
) -> None:
    stub, clock = served.stub, served.clock
    live, dead = _register(stub, "live"), _register(stub, "dead")
    _start_worker(served, live)
    clock.now += 30  # both silent in the database; "live" heartbeats now (parked)
    stub.Heartbeat(_host_beat(live, 5.0), timeout=DEADLINE_S)
    answered = served.worker.answered
    sweeper = Sweeper(
        served.deps.sessions,
        served.deps.sweep_config(),
        period_s=60.0,
        clock=clock,
        before=served.ingest.flush,
        capacity=served.capacity,
    )
    sweeper.sweep_once()
    assert served.worker.answered == answered + 1
    assert _heard(served, dead)[1] and not _heard(served, live)[1]


def test_a_killed_worker_degrades_to_the_coordinator_with_a_log_line_and_is_replaced(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    stub, clock, worker = served.stub, served.clock, served.worker
    node = _register(stub, "n1")
    _start_worker(served, node)
    (pid,) = worker.pids()
    os.kill(pid, signal.SIGKILL)
    clock.now += 1
    stub.Heartbeat(_host_beat(node, 5.0), timeout=DEADLINE_S)
    with caplog.at_level(logging.WARNING, logger="hetero.coordinator"):
        assert served.ingest.flush() == 1
    assert worker.fallbacks == 1 and worker.answered == 0
    assert "the heartbeat worker process stopped; replacing it, working here" in caplog.text
    assert _heard(served, node)[0] == clock.now  # written here all the same
    # The next flush starts another worker (written here meanwhile), which takes the
    # flushes after it.
    clock.now += 1
    stub.Heartbeat(_host_beat(node, 6.0), timeout=DEADLINE_S)
    served.ingest.flush()
    assert _heard(served, node)[0] == clock.now
    assert worker.wait_ready(60.0)
    assert worker.pids() and pid not in worker.pids()
    clock.now += 1
    stub.Heartbeat(_host_beat(node, 7.0), timeout=DEADLINE_S)
    served.ingest.flush()
    assert worker.answered == 1 and worker.fallbacks == 1
    assert _heard(served, node)[0] == clock.now


def test_the_last_flush_at_stop_is_written_by_the_worker_open_buckets_included(
    served: Served,
) -> None:
    """``stop`` ends the flusher with a flush of everything; the worker is closed after
    it (as ``server.serve`` does), so that flush is the worker's."""
    stub, clock, ingest = served.stub, served.clock, served.ingest
    node = _register(stub, "n1")
    _start_worker(served, node)
    flusher = HeartbeatIngest(
        ingest.sessions, ingest.readers, ingest.policy, flush_s=3600.0, worker=served.worker
    )
    flusher.known(node)
    flusher.start()
    clock.now += 1
    flusher.offer(store.Beat(node, clock.now, ()), _host_beat(node, 42.0))
    answered = served.worker.answered
    flusher.stop()
    assert served.worker.answered == answered + 1 and served.worker.fallbacks == 0
    assert _heard(served, node)[0] == clock.now
    assert (int(clock.now // 10), None, 42.0) in _telemetry(served, node)


def test_a_flush_of_fewer_than_min_beats_is_written_here_and_starts_no_worker(
    tmp_path: Path,
) -> None:
    """A small cluster (every coordinator a test starts) never pays for a second
    interpreter: its flushes are written on the coordinator's thread."""
    url = f"sqlite:///{tmp_path / 'small.db'}"
    engine = open_database(url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    worker = HeartbeatWorker(url)
    ingest = HeartbeatIngest(sessions, readers, TelemetryPolicy(), worker=worker)
    t0 = 1_700_000_000.0
    try:
        with sessions.begin() as s:
            nodes = [
                store.register_node(
                    s,
                    name=f"n{i}",
                    address="x",
                    agent_endpoint="",
                    agent_version="t",
                    devices=[],
                    now=t0,
                ).id
                for i in range(MIN_BEATS - 1)
            ]
        for node in nodes:
            ingest.offer(store.Beat(node, t0 + 1, ()))
        assert ingest.flush() == MIN_BEATS - 1
        assert worker.state == "idle" and worker.pids() == []
        assert (worker.answered, worker.fallbacks) == (0, 0)
        with sessions() as s:
            assert {store.get_node(s, n).last_heartbeat_unix_s for n in nodes} == {t0 + 1}
    finally:
        worker.close()
        engine.dispose()


def test_hetero_coord_serve_writes_a_clusters_flushes_in_its_worker_and_everything_at_stop(
    tmp_path: Path, both_stores_url: str
) -> None:
    """More nodes than ``MIN_BEATS`` heartbeat until a child of the coordinator has
    the database open (its engine connects at its first flush); at SIGTERM the
    parked heartbeats and open telemetry buckets are written and the worker ends."""
    on_sqlite = both_stores_url.startswith("sqlite")
    db = () if on_sqlite else ("--db", both_stores_url)
    proc, log = serve(tmp_path, *db, "--insecure")
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_S
        bound = wait_for_line(proc, log, r"listening on \S+ \(port (\d+)")
        coordinator = psutil.Process(proc.pid)
        with grpc.insecure_channel(f"127.0.0.1:{bound.group(1)}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            nodes = [_register(stub, f"n{i:03d}") for i in range(100)]
            writing = False
            while not writing:  # until a flush was written there
                assert time.monotonic() < deadline + 60, "no heartbeat worker started"
                for node in nodes:
                    stub.Heartbeat(heartbeat_request(node, 2, tick=1), timeout=DEADLINE_S)
                children = coordinator.children()
                writing = any(has_database_open(c, on_sqlite) for c in children)
            last_round = time.time()
            for node in nodes:
                stub.Heartbeat(heartbeat_request(node, 2, tick=2), timeout=DEADLINE_S)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-4000:]
        assert "coordinator stopped" in log.read_text()
        assert "Traceback" not in log.read_text()
        alive = still_running(children, timeout_s=30)
        assert not alive, f"left behind by the coordinator: {alive}"
        url = f"sqlite:///{tmp_path / 'state' / 'coordinator.db'}" if on_sqlite else both_stores_url
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                oldest = conn.scalar(text("SELECT min(last_heartbeat_unix_s) FROM nodes"))
                written = conn.scalar(
                    text("SELECT count(DISTINCT node_id) FROM telemetry WHERE bucket >= :b"),
                    {"b": int(last_round // TelemetryPolicy().period_s)},
                )
        finally:
            engine.dispose()
        # Every node's last heartbeat, and the last round's samples (their bucket still
        # open, or closed and not yet its node's turn): written at the stop.
        assert oldest >= last_round
        assert written == len(nodes)
    finally:
        kill_left(proc, children)
