"""Attack: a job that logs as fast as it can fills the coordinator's database (issue #33).

Before the fix stored logs were capped in lines: one job printed 10,000 lines of
4,096 'é' (82 MB) and the database grew from 20 to 106 MB in under 30 s; lines of
4-byte characters made a 1,000-line batch ~16 MB, over the message limit, so all of it
was dropped and the note blamed "the agent's queue was full"; finished jobs and their
specs were never deleted. Now: byte caps per job, per user and in all, checked as lines
arrive (``coordinator.logcaps``), a note that says what was dropped and why, batches cut
by bytes (``agent.shipper``), and finished jobs deleted after ``job_keep_days``.

A real coordinator on port 0 (SQLite under tmp_path) and, for the shipping, a real
agent running a real rank.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import Coordinator, hand_clocked, start_coordinator
from handclock import Clock
from simcluster import DEADLINE_S
from sqlalchemy import func, select, text

from hetero.agent.config import AgentConfig
from hetero.agent.daemon import Agent
from hetero.agent.profile import DeviceMeasure, NodeProfile
from hetero.agent.shipper import LOG_BATCH_BYTES
from hetero.agent.supervisor import DROPPED_PREFIX
from hetero.coordinator.admission import Limits
from hetero.coordinator.config import load_config
from hetero.coordinator.logcaps import NOTE_COST, NOTE_PREFIX, KiB, LogCaps, MiB, line_cost
from hetero.coordinator.models import JobRow, LogLineRow
from hetero.coordinator.retention import JobRetention
from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

CAPS = LogCaps(per_job=256 * KiB, per_user=512 * KiB, total=768 * KiB)
JOB = "name: chatty\nmodel: debug\nglobal_batch: 8\nsteps: 5\nresources: {ranks: 1, device: cpu}\n"
#: The issue's line: 4,096 'é', 8,192 bytes of UTF-8.
WIDE = "é" * 4096
DAY = 86400.0


@pytest.fixture
def capped(both_stores_url: str) -> Iterator[Coordinator]:
    """A coordinator with small log caps, on SQLite, then on PostgreSQL."""
    clock = Clock()
    c = start_coordinator(hand_clocked(both_stores_url, clock, log_caps=CAPS), clock)
    try:
        yield c
    finally:
        c.channel.close()
        c.server.stop(0).wait()


def _node(c: Coordinator, name: str = "n1", cpus: int = 1) -> str:
    devices = [
        tpb.DeviceProfile(index=i, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
        for i in range(cpus)
    ]
    req = pb.RegisterNodeRequest(name=name, address="127.0.0.1", devices=devices)
    return str(c.stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _submit(c: Coordinator, name: str = "chatty") -> str:
    spec = JOB.replace("chatty", name)
    return str(c.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S).job_id)


def _flood(c: Coordinator, job_id: str, batches: int, per_batch: int = 32) -> int:
    """``batches`` batches of the issue's lines, sent back to back; the bytes sent."""
    lines = [pb.LogLine(rank=0, stream="stdout", text=WIDE) for _ in range(per_batch)]
    for _ in range(batches):
        c.stub.AppendJobLogs(pb.AppendJobLogsRequest(job_id=job_id, lines=lines), timeout=10)
    return batches * per_batch * len(WIDE.encode())


def _db_bytes(c: Coordinator) -> int:
    """The database's bytes in use: SQLite's pages (its write-ahead log folded in), or
    PostgreSQL's log table with its index and TOAST."""
    with c.engine.connect() as conn:
        if c.engine.dialect.name == "postgresql":
            size = conn.execute(text("SELECT pg_total_relation_size('log_lines')")).scalar()
            return int(size or 0)
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar() or 0
        free = conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0
        size = conn.exec_driver_sql("PRAGMA page_size").scalar() or 0
    return int((pages - free) * size)


def _stored(c: Coordinator, job_id: str) -> tuple[int, int, list[str]]:
    """(bytes charged, the job's log_bytes column, the notes) of a job's stored lines."""
    with c.sessions() as s:
        charged = s.scalar(
            select(func.sum(LogLineRow.cost_bytes)).where(LogLineRow.job_id == job_id)
        )
        column = s.scalar(select(JobRow.log_bytes).where(JobRow.id == job_id))
        notes = s.scalars(
            select(LogLineRow.text)
            .where(LogLineRow.job_id == job_id, LogLineRow.text.startswith(NOTE_PREFIX))
            .order_by(LogLineRow.id)
        ).all()
    return int(charged or 0), int(column or 0), list(notes)


def test_a_job_that_logs_as_fast_as_it_can_grows_the_database_by_its_cap_at_most(
    capped: Coordinator,
) -> None:
    _node(capped)
    job_id = _submit(capped)
    before = _db_bytes(capped)
    sent = _flood(capped, job_id, batches=40)  # 10 MiB of text at a 256 KiB cap
    grown = _db_bytes(capped) - before
    charged, column, notes = _stored(capped, job_id)
    assert charged == column <= CAPS.per_job + NOTE_COST
    assert grown <= CAPS.per_job, f"the database grew {grown:,} bytes for a cap of 256 KiB"
    kept = CAPS.per_job // line_cost(len(WIDE.encode()))  # the note comes on top
    dropped_lines = 40 * 32 - kept
    dropped = sent - kept * len(WIDE.encode())
    assert notes == [
        f"{NOTE_PREFIX}dropped {dropped / 2**20:.3g} MiB ({dropped_lines:,} lines) here: the "
        "job's 256 KiB log cap (log_bytes_per_job); the rank logs on the nodes "
        "(rank<r>.log*) keep the newest"
    ], (notes, charged)
    # What a user reads: the lines up to the gap, then the note, last.
    got = capped.stub.GetJobLogs(pb.GetJobLogsRequest(job_id=job_id), timeout=DEADLINE_S).lines
    assert [ln.text for ln in got[:-1]] == [WIDE] * kept and got[-1].text == notes[0]
    assert got[-1].stream == "stderr" and got[-1].rank == 0


def test_a_restarted_coordinator_remembers_what_each_job_stored(capped: Coordinator) -> None:
    _node(capped)
    job_id = _submit(capped)
    _flood(capped, job_id, batches=4)  # 1 MiB: over the cap, a note
    charged, _, notes = _stored(capped, job_id)
    capped.restart()
    _flood(capped, job_id, batches=4)
    again, column, notes_after = _stored(capped, job_id)
    # No line fits after a restart: only the note of the new gap (its own: the first
    # gap's count lived in the coordinator's memory).
    assert again == column == charged + NOTE_COST
    assert len(notes_after) == 2 and notes_after[0] == notes[0]


def test_one_users_flood_never_evicts_nor_blocks_another_users_lines(tmp_path: Path) -> None:
    """The per-user cap stops ana's second job; bob's job still stores, and nothing of
    ana's first job is dropped to make room (the newest are refused, never the oldest)."""
    from hetero.coordinator.roles import NAMED
    from hetero.coordinator.server import create_server
    from hetero.security.auth import new_token
    from hetero.security.credentials import NamedCredentials
    from hetero.security.transport import ClientSecurity, ServerSecurity, client_channel
    from hetero.v1 import coordinator_pb2_grpc as pb_grpc

    clock = Clock()
    caps = LogCaps(per_job=256 * KiB, per_user=384 * KiB, total=512 * KiB)
    settings = hand_clocked(f"sqlite:///{tmp_path / 'c.db'}", clock, log_caps=caps)
    cluster, named = new_token(), NamedCredentials(new_token(), NAMED)
    server, port = create_server("127.0.0.1:0", settings, ServerSecurity(cluster, named=named))
    server.start()

    def stub(token: Any) -> pb_grpc.CoordinatorStub:
        channel = client_channel(f"127.0.0.1:{port}", ClientSecurity(token=token))
        return pb_grpc.CoordinatorStub(channel)

    try:
        admin, ana, bob = (
            stub(cluster),
            stub(named.mint("user", "ana")),
            stub(named.mint("user", "bob")),
        )
        devices = [
            tpb.DeviceProfile(index=i, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
            for i in range(3)
        ]
        admin.RegisterNode(
            pb.RegisterNodeRequest(name="n1", address="127.0.0.1", devices=devices), timeout=5
        )
        jobs = [
            who.SubmitJob(pb.SubmitJobRequest(spec_yaml=JOB), timeout=5).job_id
            for who in (ana, ana, bob)
        ]
        lines = [pb.LogLine(rank=0, text=WIDE) for _ in range(32)]
        for job_id in jobs:  # 1 MiB each, as the agents would append them
            for _ in range(4):
                admin.AppendJobLogs(pb.AppendJobLogsRequest(job_id=job_id, lines=lines), timeout=5)
        with server.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT job_id, SUM(cost_bytes), COUNT(*) FROM log_lines GROUP BY job_id")
            ).all()
            notes = dict(
                conn.execute(
                    text("SELECT job_id, text FROM log_lines WHERE text LIKE '[hetero-coord]%'")
                ).all()
            )
        stored = {job_id: (int(cost), int(n)) for job_id, cost, n in rows}
        first, second, bobs = jobs
        assert stored[first][0] <= caps.per_job + NOTE_COST
        assert "the job's 256 KiB log cap (log_bytes_per_job)" in notes[first]
        assert sum(stored[j][0] for j in (first, second)) <= caps.per_user + 2 * NOTE_COST
        assert "user:ana's 384 KiB log cap (log_bytes_per_user)" in notes[second]
        assert stored[bobs][1] > 1, "bob's job stores lines of its own"
        assert sum(c for c, _ in stored.values()) <= caps.total + 3 * NOTE_COST
        assert "the coordinator's 512 KiB log cap (log_bytes_total)" in notes[bobs]
        # ana's first job lost nothing to the others: every line it stored is there.
        assert stored[first][1] == caps.per_job // line_cost(len(WIDE.encode())) + 1
    finally:
        server.stop(0).wait()


def test_lines_that_age_out_give_their_room_back(capped: Coordinator) -> None:
    _node(capped, cpus=3)
    first, second, third = (_submit(capped, name) for name in ("a", "b", "c"))
    for job_id in (first, second, third):
        _flood(capped, job_id, batches=2)  # 512 KiB each: the user's 512 KiB are full
    assert "log_bytes_per_user" in _stored(capped, third)[2][0]
    capped.clock.now += 8 * DAY  # past log_keep_days: every line goes
    capped.server.prune()
    assert _stored(capped, first)[:2] == (0, 0)
    _flood(capped, third, batches=2)
    charged, _, notes = _stored(capped, third)
    assert charged > CAPS.per_job // 2 and "log_bytes_per_job" in notes[-1], notes


def test_finished_jobs_are_deleted_with_their_specs_after_job_keep_days(
    capped: Coordinator,
) -> None:
    _node(capped, cpus=2)
    ended, running = _submit(capped, "ended"), _submit(capped, "running")
    _flood(capped, ended, batches=1)
    capped.stub.CancelJob(pb.CancelJobRequest(job_id=ended), timeout=DEADLINE_S)
    capped.clock.now += JobRetention().keep_s - DAY
    capped.server.prune()
    with capped.sessions() as s:
        assert s.get(JobRow, ended) is not None, "not yet"
    capped.clock.now += 2 * DAY
    capped.server.prune()
    with capped.sessions() as s:
        assert s.get(JobRow, ended) is None
        assert s.scalar(select(func.count()).where(LogLineRow.job_id == ended)) == 0
        assert s.get(JobRow, running) is not None, "a job not finished is kept, however old"
    code = _code(lambda: capped.stub.GetJob(pb.GetJobRequest(job_id=ended), timeout=5))
    assert code == grpc.StatusCode.NOT_FOUND


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()  # type: ignore[no-any-return]


def test_log_caps_and_job_retention_are_read_from_coordinator_yaml(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.yaml"
    path.write_text(
        "log_bytes_per_job: 1048576\nlog_bytes_per_user: 8388608\nlog_bytes_total: 67108864\n"
        "job_keep_days: 7\n"
    )
    config = load_config(path)
    assert config.log_caps == LogCaps(per_job=1 << 20, per_user=8 << 20, total=64 << 20)
    assert config.job_retention.keep_s == 7 * DAY
    for body, message in (
        ("log_bytes_per_job: 10\n", "log_bytes_per_job: must be >= 65536, got 10"),
        ("log_bytes_per_job: 1.5\n", "log_bytes_per_job: must be a whole number, got 1.5"),
        ("log_bytes_per_job: 2097152\nlog_bytes_per_user: 1048576\n", "must grow from job"),
        ("job_keep_days: 0.5\n", "job_keep_days must be at least 1, got 0.5"),
        ("log_bytes_per_jobs: 1\n", "did you mean 'log_bytes_per_job'"),
    ):
        path.write_text(body)
        with pytest.raises(ConfigError, match=message) as err:
            load_config(path)
        assert "\n" not in str(err.value)


#: A rank that prints 1,000 lines of 4,096 4-byte characters (16 KiB each) as fast as
#: it can: a 1,000-line batch of them is 16 MiB.
FLOOD = (
    "import sys\n"
    "for i in range(1000): sys.stdout.write(f'{i:03d} ' + '\\U0001f600' * 4092 + '\\n')\n"
)


@pytest.mark.parametrize("batch_bytes", [LOG_BATCH_BYTES, 8 * MiB], ids=["cut", "split"])
def test_an_agent_ships_wide_lines_under_the_coordinators_message_limit(
    db_url: str, tmp_path: Path, batch_bytes: int
) -> None:
    """A coordinator taking messages of 3 MiB at most, a real agent and rank: every line
    arrives, in order, and nothing is noted as dropped. Before, a batch was 1,000 lines,
    ~16 MiB of them, refused whole and noted as "the agent's queue was full". Batches
    are cut at 1 MiB; one larger than the coordinator takes (an agent cutting at 8 MiB)
    is refused and sent again in halves, each alone."""
    clock = Clock()
    limits = Limits(max_message_bytes=3 * MiB)
    c = start_coordinator(hand_clocked(db_url, clock, limits=limits), clock)
    profile = NodeProfile("test cpu", 1, 10.0, 1 << 30, (DeviceMeasure(0, "cpu", "cpu", 1.0),))
    config = AgentConfig(
        coordinator=c.address,
        name="n1",
        address="127.0.0.1",
        local_listen="127.0.0.1:0",
        state_dir=tmp_path / "agent",
    )
    agent = Agent(config, profile)
    agent.shipper.batch_bytes = batch_bytes
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        _wait_for(
            "the node", lambda: bool(c.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes)
        )
        spec = (
            f"name: wide\ncommand: {json.dumps([sys.executable, '-c', FLOOD])}\n"
            "global_batch: 8\nsteps: 5\nresources: {ranks: 1, device: cpu}\n"
        )
        job_id = c.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=5).job_id

        def lines() -> list[pb.LogLine]:
            got: list[pb.LogLine] = []
            while True:
                req = pb.GetJobLogsRequest(job_id=job_id, after_seq=got[-1].seq if got else 0)
                page = c.stub.GetJobLogs(req, timeout=5).lines
                if not page:
                    return got
                got.extend(page)

        def ended() -> bool:
            job = c.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5)
            return job.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED)

        _wait_for("the job's end", ended, 120)
        _wait_for("every line", lambda: sum(x.stream == "stdout" for x in lines()) >= 1000, 60)
        got = lines()
        assert [x.text for x in got if x.stream == "stdout"] == [
            f"{i:03d} " + "\U0001f600" * 4092 for i in range(1000)
        ]
        assert not [x.text for x in got if x.text.startswith(DROPPED_PREFIX)]
    finally:
        agent.stop()
        thread.join(timeout=30)
        c.channel.close()
        c.server.stop(0).wait()


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
