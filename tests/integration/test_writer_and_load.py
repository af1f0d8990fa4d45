"""The coordinator's one writer (``coordinator.writer``) and the load of its state at start
(``coordinator.persist``), on a real SQLite file, then PostgreSQL: operations committed
in batches and answered after the commit, a failed batch failing exactly the operations
whose changes were not kept, the disk full told apart, and a load that reads back
what the operations wrote."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select, text
from sqlalchemy.orm import Session

from hetero.bench import seed
from hetero.coordinator import lifecycle, persist
from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.models import EventRow, JobRow, NodeRow, PlanRow
from hetero.coordinator.state import ClusterState, Device, Event, Job, Node, Plan, Rank
from hetero.coordinator.writer import StoreFull, StoreUnavailable, Writer
from hetero.core.balancer import RankInterval
from hetero.core.jobspec import parse_jobspec

SPEC = """\
name: load-me
model: simple_cnn
global_batch: 64
steps: 100
policy: dynamic
rebalance_interval: 10
max_restarts: 2
resources:
  ranks: 2
  device: cpu
"""


@pytest.fixture
def engine(both_stores_url: str) -> Iterator[Engine]:
    engine = open_database(both_stores_url)
    try:
        yield engine
    finally:
        engine.dispose()


def _node(node_id: str, name: str, heard: float = 1000.0) -> Node:
    return Node(
        id=node_id,
        name=name,
        address=f"{name}.local",
        agent_endpoint=f"{name}.local:7071",
        agent_version="test",
        registered_at_unix_s=900.0,
        last_heartbeat_unix_s=heard,
        devices=(
            Device(0, "cpu", "cpu", 2.5, memory_bytes=64 << 30, suspect="matmul_tflops"),
            Device(1, "NVIDIA L4", "cuda", 30.0, matmul_tflops=120.0, emulated_slowdown=2.0),
        ),
    )


def _job(job_id: str, state: str, submitted: float, **fields: Any) -> Job:
    return Job(
        id=job_id,
        name="load-me",
        spec=parse_jobspec(SPEC, source="job.yaml"),
        spec_yaml=SPEC,
        state=state,
        submitted_at_unix_s=submitted,
        world_size=2,
        **fields,
    )


class _Stall:
    """An operation that waits for ``gate`` on the writer's thread, then fails: the
    batch it is in fails, and what was queued meanwhile is behind it."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()

    def apply(self, s: Session) -> None:
        self.started.set()
        self.gate.wait(10.0)
        s.execute(text("SELECT * FROM no_such_table"))


def _count(engine: Engine, model: type[Any]) -> int:
    with Session(engine) as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def test_operations_are_committed_in_batches_and_answered_after_the_commit(
    engine: Engine,
) -> None:
    async def main() -> Writer:
        writer = Writer(session_factory(engine), linger_s=0.05)
        writer.start()
        # Put together: one transaction; each awaited future means "committed".
        pending = [
            writer.put(persist.save_node(_node(f"n{i}", f"node-{i}"), devices=True))
            for i in range(5)
        ]
        await asyncio.gather(*pending)
        assert _count(engine, NodeRow) == 5, "committed before the futures resolved"
        await writer.write(persist.save_node(_node("n0", "node-0", heard=2000.0)))
        await writer.barrier()
        await writer.stop()
        return writer

    writer = asyncio.run(main())
    assert writer.batches == 2 and writer.written == 6
    with Session(engine) as s:
        node = s.get(NodeRow, "n0")
        assert node is not None and node.last_heartbeat_unix_s == 2000.0, "saved again: updated"
        assert [d.index for d in node.devices] == [0, 1], "a save without devices keeps them"


def test_a_failed_commit_fails_its_operations_and_those_behind_it_and_keeps_none(
    engine: Engine,
) -> None:
    failures: list[StoreUnavailable] = []

    async def recover(error: StoreUnavailable) -> None:
        failures.append(error)

    async def main() -> list[BaseException | None]:
        writer = Writer(session_factory(engine), linger_s=0.0, on_failure=recover)
        writer.start()
        stall = _Stall()
        first = writer.put(persist.save_node(_node("a", "node-a")), stall)
        while not stall.started.is_set():  # the batch is on the writer's thread now
            await asyncio.sleep(0.01)
        behind = writer.put(persist.save_node(_node("b", "node-b")))
        stall.gate.set()
        outcomes = await asyncio.gather(first, behind, return_exceptions=True)
        after = writer.put(persist.save_node(_node("c", "node-c")))
        await after
        await writer.stop()
        return [o if isinstance(o, BaseException) else None for o in outcomes]

    outcomes = asyncio.run(main())
    assert all(isinstance(o, StoreUnavailable) and o.grpc_code == "UNAVAILABLE" for o in outcomes)
    assert len(failures) == 1 and "did not take the write" in str(failures[0])
    with Session(engine) as s:
        assert sorted(s.scalars(select(NodeRow.name))) == ["node-c"], "only what came after"


def test_a_full_disk_is_resource_exhausted(engine: Engine, both_stores_url: str) -> None:
    if not both_stores_url.startswith("sqlite"):
        pytest.skip("a full disk is made with SQLite's max_page_count")

    class _FillDisk:
        def apply(self, s: Session) -> None:
            pages = s.execute(text("PRAGMA page_count")).scalar_one()
            s.execute(text(f"PRAGMA max_page_count = {pages}"))
            big = "x" * 1_000_000
            job = _job("big", lifecycle.QUEUED, 1.0)
            s.execute(insert(JobRow).values({**persist.job_values(job), "message": big}))

    async def main() -> BaseException | None:
        writer = Writer(session_factory(engine), linger_s=0.0)
        writer.start()
        try:
            await writer.write(_FillDisk())
        except StoreUnavailable as exc:
            return exc
        finally:
            await writer.stop()
        return None

    error = asyncio.run(main())
    assert isinstance(error, StoreFull) and error.grpc_code == "RESOURCE_EXHAUSTED"
    assert "out of disk space" in str(error)


def test_the_load_reads_back_what_the_operations_wrote(engine: Engine) -> None:
    now = 10_000.0
    nodes = [_node("n1", "alpha"), _node("n2", "beta")]
    queued = [_job("q2", lifecycle.QUEUED, 3.0), _job("q1", lifecycle.QUEUED, 2.0, priority=1)]
    running = _job(
        "r",
        lifecycle.RUNNING,
        1.0,
        backend="gloo",
        master_addr="alpha.local",
        master_port=29501,
        restarts=1,
        attempt_first_plan=2,
        last_step=30,
        ranks=[
            Rank(0, "n1", 0, "cpu", "cpu", 0, lifecycle.RUNNING, effective_score=2.5),
            Rank(1, "n2", 0, "cpu", "cpu", 0, lifecycle.RUNNING, emulated_slowdown=2.0),
        ],
    )
    old = _job("old", lifecycle.SUCCEEDED, 0.5, finished_at_unix_s=now - 2 * 3600)
    recent = _job("recent", lifecycle.FAILED, 0.6, finished_at_unix_s=now - 60)
    plans = [
        Plan(1, 0, (32, 32), "dynamic", "equal split (plain DDP)", 1.0),
        Plan(2, 0, (32, 32), "dynamic", "restart", 5.0),
        Plan(3, 20, (40, 24), "dynamic", "rank 1 slower", 6.0, predicted_step_s=0.1),
    ]
    intervals = [
        (step, tuple(RankInterval(r, b, 10, 0.01 * b, 0.5, None) for r, b in enumerate(batches)))
        for step, batches in ((10, (32, 32)), (20, (32, 32)), (30, (40, 24)))
    ]
    events = [
        Event(7, 2.0, "job_submitted", "job load-me placed", "r"),
        Event(8, 3.0, "not-helping", "hetero is not helping here: noise", "r"),
    ]

    async def main() -> None:
        writer = Writer(session_factory(engine))
        writer.start()
        ops: list[Any] = [persist.save_node(n, devices=True) for n in nodes]
        ops += [persist.save_job(j) for j in (*queued, running, old, recent)]
        ops += [persist.add_plan("r", p) for p in plans]
        # An interval of the attempt before (plan 1) is not part of the current history.
        ops.append(seed.interval_rows("r", intervals[0], 1, now))
        ops += [seed.interval_rows("r", iv, 2, now) for iv in intervals[1:]]
        ops.append(persist.add_events(events))
        await writer.write(*ops)
        await writer.stop()

    asyncio.run(main())
    with session_factory(engine)() as s:
        state = persist.load(s, now=now, history=17)

    assert sorted(state.nodes) == ["n1", "n2"]
    assert state.nodes["n1"].devices == nodes[0].devices
    assert state.node_named("beta") is state.nodes["n2"]
    assert sorted(state.jobs) == ["q1", "q2", "r", "recent"], "jobs that ended long ago stay out"
    assert [j.id for j in state.queued()] == ["q1", "q2"]
    job = state.jobs["r"]
    assert job.spec == parse_jobspec(SPEC, source="job.yaml"), "the spec is parsed at load"
    assert (job.policy, job.global_batch, job.max_restarts) == ("dynamic", 64, 2)
    assert (job.restarts, job.attempt_first_plan, job.last_step) == (1, 2, 30)
    assert [(r.rank, r.node_id, r.emulated_slowdown) for r in job.ranks] == [
        (0, "n1", 1.0),
        (1, "n2", 2.0),
    ]
    assert job.plan == plans[-1]
    assert [step for step, _ in job.history] == [20, 30], "the current attempt's intervals"
    assert job.history[-1][1] == intervals[-1][1]
    assert [e.id for e in job.events] == [7, 8]
    assert job.not_helping == "hetero is not helping here: noise"
    assert state.next_event_id == 9
    assert state.ports_in_use() == {29501}
    assert _count(engine, EventRow) == 2 and _count(engine, PlanRow) == 3


def test_what_the_rules_change_is_what_a_restarted_coordinator_loads(engine: Engine) -> None:
    """Every change of ``cluster.Cluster`` reaches the database through its operations: a
    coordinator that loads after them holds what the first one held."""
    from hetero.coordinator.cluster import Cluster, Rules

    cluster = Cluster(ClusterState(), Rules(heartbeat_timeout_s=10.0, started_at=0.0))
    text = SPEC.replace("ranks: 2", "ranks: 2\n  allow_exclusion: false")

    async def main() -> None:
        writer = Writer(session_factory(engine))
        writer.start()
        for i in range(3):
            cluster.register(
                name=f"n{i}",
                address=f"n{i}.local",
                agent_endpoint="",
                agent_version="t",
                devices=(Device(0, "cpu", "cpu", 1.0),),
                now=100.0,
            )
        spec = parse_jobspec(text, source="job.yaml")
        running, _ = cluster.submit(spec, text, now=101.0, priority=0, owner="ana")
        cluster.submit(spec, text, now=102.0, priority=0, owner="bob")
        cancelled, _ = cluster.submit(spec, text, now=103.0, priority=3, owner="bob")
        cluster.cancel(cancelled.id, now=104.0)
        for r in running.ranks:
            cluster.rank_status(
                running.id, r.rank, node_id=r.node_id, state="RUNNING", exit_code=None, now=105.0
            )
        cluster.drain("n2", True, now=106.0)
        await writer.write(*cluster.take()[0])
        await writer.stop()

    asyncio.run(main())
    with session_factory(engine)() as s:
        loaded = persist.load(s, now=107.0, history=17)
    held = cluster.state
    assert loaded.next_event_id == held.next_event_id
    assert [j.id for j in loaded.queued()] == [j.id for j in held.queued()]
    for job_id, job in held.jobs.items():
        again = loaded.jobs[job_id]
        assert persist.job_values(again) == persist.job_values(job)
        assert [vars(r) for r in again.ranks] == [vars(r) for r in job.ranks]
        assert again.plan == job.plan and list(again.events) == list(job.events)
    for node_id, node in held.nodes.items():
        assert persist.node_values(loaded.nodes[node_id]) == persist.node_values(node)
        assert loaded.nodes[node_id].devices == node.devices
