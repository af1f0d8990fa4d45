"""The coordinator's high-rate paths, as ``hetero-coord serve`` wires them, over real gRPC
and SQLite, then PostgreSQL: batched heartbeats, cached polls and plans, read-only sessions, queued
writers (``hetero-bench load`` end to end: ``test_load_bench.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from handclock import Clock
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from hetero.bench.loadgen import device_profiles, heartbeat_request
from hetero.coordinator import store
from hetero.coordinator.database import open_database, read_session_factory, session_factory
from hetero.coordinator.ingest import HeartbeatIngest
from hetero.coordinator.models import NodeRow
from hetero.coordinator.readcache import IntervalHistories, LatestPlans, PendingOrders
from hetero.coordinator.recovery import Sweeper
from hetero.coordinator.server import create_server
from hetero.coordinator.service import Deps
from hetero.coordinator.store import TelemetryPolicy
from hetero.coordinator.views import HISTORY_FOR_REPORT
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
JOB = """\
name: cached
model: debug
global_batch: 16
steps: 100
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 2
  device: cuda
"""


@dataclass
class Served:
    stub: pb_grpc.CoordinatorStub
    deps: Deps
    ingest: HeartbeatIngest
    clock: Clock


@pytest.fixture
def served(both_stores_url: str) -> Iterator[Served]:
    """The production wiring of ``server.serve`` with a hand-moved clock; the ingest's
    flusher is not started, so each test flushes when it wants the writes."""
    engine = open_database(both_stores_url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    policy = TelemetryPolicy(period_s=10.0, retention_s=60.0)
    ingest = HeartbeatIngest(sessions, readers, policy)
    clock = Clock()
    deps = Deps(
        sessions=sessions,
        readers=readers,
        ingest=ingest,
        orders=PendingOrders(readers, ttl_s=0.0),
        plans=LatestPlans(readers, ttl_s=60.0),
        histories=IntervalHistories(HISTORY_FOR_REPORT),
        telemetry=policy,
        clock=clock,
    )
    server, port = create_server("127.0.0.1:0", deps)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(pb_grpc.CoordinatorStub(channel), deps, ingest, clock)
    finally:
        channel.close()
        server.stop(0).wait()
        engine.dispose()


def _register(stub: pb_grpc.CoordinatorStub, name: str) -> str:
    req = pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=device_profiles(2))
    return str(stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _nodes(stub: pb_grpc.CoordinatorStub) -> dict[str, pb.Node]:
    return {n.name: n for n in stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes}


def test_heartbeats_are_written_at_the_flush_and_old_telemetry_is_deleted(served: Served) -> None:
    stub, clock = served.stub, served.clock
    node = _register(stub, "n1")
    registered_at = _nodes(stub)["n1"].last_heartbeat_unix_s
    clock.now += 5
    stub.Heartbeat(heartbeat_request(node, 2, tick=1), timeout=DEADLINE_S)
    assert _nodes(stub)["n1"].last_heartbeat_unix_s == registered_at  # parked, not written
    assert served.ingest.flush() == 1  # liveness; the telemetry's bucket is still open
    n1 = _nodes(stub)["n1"]
    assert n1.last_heartbeat_unix_s == clock.now
    assert [t.device_index for t in n1.telemetry] == [0, 1]  # from memory
    assert n1.host.ram_total_bytes > 0
    assert _telemetry_buckets(served) == []
    # Two beats in one bucket keep one row per device holding the newest sample;
    # after the retention window a node's old rows go.
    clock.now += 1
    stub.Heartbeat(heartbeat_request(node, 2, tick=2), timeout=DEADLINE_S)
    clock.now += 120
    stub.Heartbeat(heartbeat_request(node, 2, tick=3), timeout=DEADLINE_S)
    served.ingest.flush()  # the first bucket closed, was written and fell out of retention
    assert _telemetry_buckets(served) == []
    assert [t.device_index for t in _nodes(stub)["n1"].telemetry] == [0, 1]
    served.ingest.flush(everything=True)  # as at shutdown: the open bucket too
    assert _telemetry_buckets(served) == [(int(clock.now // 10), 3)]


def test_telemetry_is_written_once_when_its_bucket_closes(served: Served) -> None:
    stub, clock = served.stub, served.clock
    node = _register(stub, "n1")
    first = int(clock.now // 10) + 1
    clock.now = first * 10.0 + 1  # one second into a bucket
    for cpu in (10.0, 20.0, 30.0):  # three beats, three flushes, one open bucket
        stub.Heartbeat(_host_beat(node, cpu), timeout=DEADLINE_S)
        served.ingest.flush()
        assert _telemetry_buckets(served) == []
        assert _nodes(stub)["n1"].host.cpu_percent == cpu
        clock.now += 2
    # The bucket has closed; it is written at the node's turn within the next period.
    clock.now = (first + 1) * 10.0
    stub.Heartbeat(_host_beat(node, 40.0), timeout=DEADLINE_S)
    served.ingest.flush()
    assert _nodes(stub)["n1"].host.cpu_percent == 40.0
    clock.now = (first + 2) * 10.0
    stub.Heartbeat(_host_beat(node, 50.0), timeout=DEADLINE_S)
    served.ingest.flush()
    with served.deps.sessions() as s:
        rows = s.execute(text("SELECT bucket, cpu_percent FROM telemetry")).all()
    assert rows == [(first, 30.0)]  # the newest of its bucket, written once
    assert _nodes(stub)["n1"].host.cpu_percent == 50.0


def _telemetry_buckets(served: Served) -> list[tuple[int, int]]:
    with served.deps.sessions() as s:
        rows = s.execute(text("SELECT bucket, count(*) FROM telemetry GROUP BY bucket")).all()
    return [(int(b), int(n)) for b, n in rows]


def test_a_heartbeat_of_an_unknown_node_is_refused_at_once(served: Served) -> None:
    with pytest.raises(grpc.RpcError) as info:
        served.stub.Heartbeat(heartbeat_request("nope", 1, tick=1), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert served.ingest.flush() == 0


def test_polls_carry_new_launches_and_get_plan_never_goes_behind_a_report(served: Served) -> None:
    stub = served.stub
    node = _register(stub, "gpu")
    beat = stub.Heartbeat(heartbeat_request(node, 2, tick=1), timeout=DEADLINE_S)
    assert beat.HasField("orders_pending") and not beat.orders_pending  # the agent won't poll
    served.ingest.flush()
    poll = pb.PollAssignmentsRequest(node_id=node)
    assert not stub.PollAssignments(poll, timeout=DEADLINE_S).launches
    job = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=JOB), timeout=DEADLINE_S).job
    beat = stub.Heartbeat(heartbeat_request(node, 2, tick=2), timeout=DEADLINE_S)
    assert beat.orders_pending  # the next heartbeat tells the agent to poll
    assert len(stub.PollAssignments(poll, timeout=DEADLINE_S).launches) == 2
    first = stub.GetPlan(tpb.GetPlanRequest(job_id=job.id), timeout=DEADLINE_S)
    # A report that re-plans: GetPlan answers the new plan at once, though its cache
    # would otherwise hold the first for a minute.
    report = tpb.IntervalReport(job_id=job.id, end_step=10, plan_version=first.version)
    for rank, seconds in enumerate((0.01, 0.05)):
        report.ranks.add(rank=rank, batch=8, steps=10, compute_s=seconds, step_s=0.06)
    new = stub.ReportIntervalStats(report, timeout=DEADLINE_S).plan
    assert new.version > first.version
    assert stub.GetPlan(tpb.GetPlanRequest(job_id=job.id), timeout=DEADLINE_S) == new
    with pytest.raises(grpc.RpcError) as info:
        stub.GetPlan(tpb.GetPlanRequest(job_id="nope"), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_history_kept_in_memory_is_the_one_the_database_holds(served: Served) -> None:
    """Reports in order, a re-sent one and a late one: the history the next report
    starts from is, step for step, what reading it back would give."""
    stub = served.stub
    node = _register(stub, "gpu")
    stub.Heartbeat(heartbeat_request(node, 2, tick=1), timeout=DEADLINE_S)
    job = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=JOB), timeout=DEADLINE_S).job
    version = stub.GetPlan(tpb.GetPlanRequest(job_id=job.id), timeout=DEADLINE_S).version
    for step, slow in ((10, 0.05), (20, 0.06), (30, 0.07), (30, 0.08), (50, 0.05), (40, 0.09)):
        report = tpb.IntervalReport(job_id=job.id, end_step=step, plan_version=version)
        for rank, seconds in enumerate((0.01, slow)):
            report.ranks.add(rank=rank, batch=8, steps=10, compute_s=seconds, step_s=0.1)
        version = stub.ReportIntervalStats(report, timeout=DEADLINE_S).plan.version
    histories = served.deps.histories
    assert histories is not None
    with served.deps.sessions() as s:
        row = store.get_job(s, job.id)
        stored = store.interval_steps(s, row, HISTORY_FOR_REPORT)
        attempt = row.attempt_first_plan
    kept = histories.get(job.id, attempt)
    assert kept == stored
    assert [step for step, _ in stored] == [10, 20, 30, 40, 50]
    assert stored[2][1][1].compute_s == 0.08  # the re-sent report won
    served.deps.invalidate_caches()
    assert histories.get(job.id, attempt) is None


def _host_beat(node: str, cpu: float, sampled_at: float | None = None) -> pb.HeartbeatRequest:
    req = pb.HeartbeatRequest(node_id=node, host=tpb.HostTelemetry(cpu_percent=cpu))
    if sampled_at is not None:
        req.sampled_at_unix_s = sampled_at
    return req


def test_a_burst_of_buffered_telemetry_keeps_a_sample_per_bucket_it_was_sampled_in(
    served: Served,
) -> None:
    """After a coordinator outage an agent sends what it buffered in a burst; parked by
    arrival they would share one bucket and all but the last would be lost."""
    stub, clock = served.stub, served.clock
    node = _register(stub, "n1")
    clock.now += 5  # mid-bucket: a sample 0.5 s older shares the live bucket
    now = clock.now
    # Period 10 s, retention 60 s: a live sample, three buffered ones in three other
    # buckets, one beyond retention (dropped), and one older than the live sample of
    # the live bucket (never replaces it).
    stub.Heartbeat(_host_beat(node, 50.0), timeout=DEADLINE_S)
    for cpu, age in ((1.0, 35.0), (2.0, 25.0), (3.0, 15.0), (9.0, 90.0)):
        stub.Heartbeat(_host_beat(node, cpu, sampled_at=now - age), timeout=DEADLINE_S)
    stub.Heartbeat(_host_beat(node, 7.0, sampled_at=now - 0.5), timeout=DEADLINE_S)
    served.ingest.flush(everything=True)
    with served.deps.sessions() as s:
        rows = s.execute(
            text("SELECT time_unix_s, cpu_percent FROM telemetry ORDER BY time_unix_s")
        ).all()
    assert rows == [(now - 35.0, 1.0), (now - 25.0, 2.0), (now - 15.0, 3.0), (now, 50.0)]
    assert _nodes(stub)["n1"].last_heartbeat_unix_s == now  # alive as of arrival
    # Written separately, a late buffered sample never replaces the newer one either.
    stub.Heartbeat(_host_beat(node, 8.0, sampled_at=now - 0.25), timeout=DEADLINE_S)
    served.ingest.flush(everything=True)
    with served.deps.sessions() as s:
        live = s.execute(
            text("SELECT cpu_percent FROM telemetry WHERE time_unix_s >= :t"), {"t": now - 1}
        )
        assert live.scalars().all() == [50.0]


def test_a_node_marked_down_is_up_again_when_its_batched_heartbeat_is_written(
    served: Served,
) -> None:
    stub, clock = served.stub, served.clock
    node = _register(stub, "n1")
    with served.deps.sessions.begin() as s:
        store.mark_down(s, store.get_node(s, node), 11.0, now=clock.now)
    clock.now += 1
    stub.Heartbeat(_host_beat(node, 5.0), timeout=DEADLINE_S)  # known: parked
    with served.deps.sessions() as s:
        assert store.get_node(s, node).down
    served.ingest.flush()
    with served.deps.sessions() as s:
        n1 = store.get_node(s, node)
        assert not n1.down and n1.last_heartbeat_unix_s == clock.now
        kinds = s.execute(text("SELECT kind FROM events WHERE node_id = :n"), {"n": node})
        assert [k for k in kinds.scalars() if k in ("node_down", "node_up")] == [
            "node_down",
            "node_up",
        ]
        # The sweeper's query agrees: up and recently heard, so not silent.
        assert store.silent_nodes(s, since=clock.now - 10) == []


def test_a_sample_written_after_its_node_went_down_does_not_mark_it_up(served: Served) -> None:
    """A closed bucket's sample is written up to a period after it arrived: by then the
    node may have been marked down (its agent was killed), and it must stay down."""
    stub, clock = served.stub, served.clock
    node = _register(stub, "n1")
    stub.Heartbeat(_host_beat(node, 5.0), timeout=DEADLINE_S)
    served.ingest.flush()  # liveness written; the sample's bucket is still open
    with served.deps.sessions.begin() as s:
        store.mark_down(s, store.get_node(s, node), 11.0, now=clock.now + 11)
    other = _register(stub, "n2")
    clock.now += 30  # n1's bucket closed long ago; n2 keeps the clock moving
    stub.Heartbeat(_host_beat(other, 1.0), timeout=DEADLINE_S)
    served.ingest.flush()
    with served.deps.sessions() as s:
        assert store.get_node(s, node).down
        written = s.execute(
            text("SELECT cpu_percent FROM telemetry WHERE node_id = :n"), {"n": node}
        )
        assert written.scalars().all() == [5.0]  # the sample itself is kept


def test_a_plan_stored_outside_a_report_is_served_once_the_caches_are_dropped(
    served: Served,
) -> None:
    """The sweeper (a restart: ``store.replace_job``) stores plans without a report; it
    drops the caches after its commit (``Deps.invalidate_caches``)."""
    stub = served.stub
    node = _register(stub, "gpu")
    job = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=JOB), timeout=DEADLINE_S).job
    first = stub.GetPlan(tpb.GetPlanRequest(job_id=job.id), timeout=DEADLINE_S)
    with served.deps.sessions.begin() as s:
        store.add_plan(s, job.id, (4, 12), 0, "dynamic", "restart", now=served.clock.now)
    # Cached for a minute (the fixture's ttl) ...
    assert stub.GetPlan(tpb.GetPlanRequest(job_id=job.id), timeout=DEADLINE_S) == first
    served.deps.invalidate_caches()
    new = stub.GetPlan(tpb.GetPlanRequest(job_id=job.id), timeout=DEADLINE_S)
    assert new.version == first.version + 1 and list(new.batches) == [4, 12]
    assert node


def test_read_sessions_cannot_write_and_writers_from_many_threads_all_commit(
    both_stores_url: str,
) -> None:
    engine = open_database(both_stores_url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    with sessions.begin() as s:
        s.execute(text("CREATE TABLE counter (n INTEGER)"))
        s.execute(text("INSERT INTO counter VALUES (0)"))
    # SQLite: "attempt to write a readonly database"; PostgreSQL: "cannot execute UPDATE
    # in a read-only transaction".
    with readers() as s, pytest.raises(DBAPIError, match=r"read-?only"):
        s.execute(text("UPDATE counter SET n = n + 1"))
    # A write that fails rolls back and lets the next writer in (no lock left held).
    with pytest.raises(ZeroDivisionError), sessions.begin() as s:
        s.execute(text("UPDATE counter SET n = 1000"))
        _ = 1 / 0
    t0 = time.monotonic()
    with sessions.begin() as s:
        assert s.execute(text("SELECT n FROM counter")).scalar_one() == 0
    assert time.monotonic() - t0 < 1.0
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(25):
                with sessions.begin() as s:
                    n = s.execute(text("SELECT n FROM counter")).scalar_one()
                    s.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
                with readers() as s:
                    s.execute(text("SELECT n FROM counter")).scalar_one()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with readers() as s:
        assert s.execute(text("SELECT n FROM counter")).scalar_one() == 8 * 25
    engine.dispose()


def test_the_sweeper_flushes_parked_heartbeats_first_and_drops_the_caches_on_a_change(
    served: Served,
) -> None:
    """A heartbeat still parked must not let its node look silent (the database lags by
    up to a flush); a sweep that marked a node down drops the read caches."""
    stub, clock = served.stub, served.clock
    live, dead = _register(stub, "live"), _register(stub, "dead")
    clock.now += 30  # both silent in the database; "live" heartbeats now (parked)
    stub.Heartbeat(_host_beat(live, 5.0), timeout=DEADLINE_S)
    changes: list[int] = []
    sweeper = Sweeper(
        served.deps.sessions,
        served.deps.sweep_config(),
        period_s=0.05,
        clock=clock,
        before=served.ingest.flush,
        on_change=lambda: changes.append(1),
    )
    sweeper.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not changes and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sweeper.stop()
    assert changes, "the sweep that marked a node down reported a change"
    with served.deps.sessions() as s:
        assert store.get_node(s, dead).down
        assert not store.get_node(s, live).down


def test_a_flush_of_a_thousand_nodes_writes_each_one_in_statements_of_many_rows(
    both_stores_url: str,
) -> None:
    """One flush larger than a statement's parameters (on SQLite the rows go in
    statements of many rows each): every known node's newest arrival, never moved back,
    a down node up again, every sample kept once, the unknown ids returned."""
    engine = open_database(both_stores_url)
    sessions = session_factory(engine)
    policy = TelemetryPolicy()
    t0 = 1_700_000_000.0
    try:
        with sessions.begin() as s:
            ids = [
                store.register_node(
                    s,
                    name=f"n{i:04d}",
                    address=f"10.0.{i // 256}.{i % 256}",
                    agent_endpoint="",
                    agent_version="test",
                    devices=[],
                    now=t0,
                ).id
                for i in range(1000)
            ]
        with sessions.begin() as s:
            store.mark_down(s, store.get_node(s, ids[7]), 11.0, now=t0 + 1)
            s.get(NodeRow, ids[8]).last_heartbeat_unix_s = t0 + 99  # a later flush's, first
        samples = tuple(
            {"device_index": d, "utilization_percent": 50.0 + i % 7}
            for d, i in zip((None, 0, 1, 2), range(4), strict=True)
        )
        beats = [store.Beat(node, t0 + 10, samples) for node in ids]
        beats += [store.Beat(f"gone-{k}", t0 + 10, samples) for k in range(3)]
        with sessions.begin() as s:
            gone = store.record_heartbeats(s, beats, policy=policy)
        assert gone == {"gone-0", "gone-1", "gone-2"}
        with sessions() as s:
            heard = dict(s.execute(select(NodeRow.id, NodeRow.last_heartbeat_unix_s)).all())
            assert heard[ids[8]] == t0 + 99  # never moved back
            assert {heard[n] for n in ids if n != ids[8]} == {t0 + 10}
            assert not store.get_node(s, ids[7]).down
            per_node = s.execute(
                text("SELECT count(*), count(DISTINCT node_id), count(device_index) FROM telemetry")
            ).one()
            assert tuple(per_node) == (4000, 1000, 3000)  # 4 rows a node, the host's index NULL
        # Half the nodes report again in the next bucket, with two samples: the newest
        # bucket of every node in one query, as one node's own read gives it.
        later = [store.Beat(node, t0 + 25, samples[:2]) for node in ids[:500]]
        with sessions.begin() as s:
            store.record_heartbeats(s, later, policy=policy)
        with sessions() as s:
            many = store.latest_telemetry_of(s, [*ids, "gone-0"])
            assert len(many) == 1000 and "gone-0" not in many
            assert len(many[ids[0]]) == 2 and len(many[ids[999]]) == 4
            for node in ids[::97]:
                one = store.latest_telemetry(s, node)
                assert {k: r.id for k, r in many[node].items()} == {k: r.id for k, r in one.items()}
    finally:
        engine.dispose()
