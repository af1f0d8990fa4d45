"""One coordinator serves a database at a time (``coordinator.standby``): a second one on a
SQLite file refuses to start in one line; on PostgreSQL it waits as a standby,
NOT_SERVING, and takes over with the first one's state once that one stops."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from alembic import command
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hetero.coordinator.database import DatabaseError, connect, open_database
from hetero.coordinator.schema import alembic_config, current_revision, head
from hetero.coordinator.server import Settings, create_server
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S).status)


def _register(port: int, name: str) -> None:
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        pb_grpc.CoordinatorStub(channel).RegisterNode(
            pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=[device]),
            timeout=DEADLINE_S,
        )


def _nodes(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = pb_grpc.CoordinatorStub(channel).ListNodes(
            pb.ListNodesRequest(), timeout=DEADLINE_S
        )
        return [n.name for n in reply.nodes]


def test_a_second_coordinator_on_a_sqlite_file_refuses_to_start_in_one_line(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    first, port = create_server("127.0.0.1:0", Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}"))
    first.start()
    try:
        with pytest.raises(DatabaseError, match=r"another coordinator \(pid \d+\) serves"):
            create_server("127.0.0.1:0", Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}"))
        assert _health(port) == SERVING, "the first one serves on"
        serve = [sys.executable, "-m", "hetero.coordinator.cli", "serve"]
        serve += ["--listen", "127.0.0.1:0", "--state-dir", str(state)]
        with subprocess.Popen(serve, stderr=subprocess.DEVNULL) as running:
            deadline = time.monotonic() + 60
            while (
                not (state / "coordinator.db.lock").exists()
                or not (state / "coordinator.db.lock").read_text().strip()
            ):
                assert running.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            time.sleep(1.0)
            second = subprocess.run(serve, capture_output=True, text=True, timeout=60)
            running.terminate()
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: another coordinator (pid")
    finally:
        first.stop(0).wait()
    again, _ = create_server("127.0.0.1:0", Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}"))
    again.stop(0).wait()  # the first one stopped: its lock went with it


def _older_database(path: Path) -> str:
    """A SQLite database one schema revision behind this coordinator's; its revision."""
    engine = open_database(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "-1")
        older = current_revision(engine)
    finally:
        engine.dispose()
    assert older is not None and older != head()
    return older


def test_a_refused_coordinator_or_upgrade_leaves_the_served_schema_alone(tmp_path: Path) -> None:
    """The lock is taken before the schema is touched: a newer coordinator started by
    mistake beside a serving one must not upgrade the database under it."""
    state = tmp_path / "state"
    state.mkdir()
    db = state / "coordinator.db"
    older = _older_database(db)
    lock = db.with_name(db.name + ".lock")
    # A serving coordinator, as far as the lock says: this test's own process holds it.
    with lock.open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        with pytest.raises(DatabaseError, match=r"another coordinator \(pid 4242\) serves"):
            create_server("127.0.0.1:0", Settings(db_url=f"sqlite:///{db}"))
        upgrade = [sys.executable, "-m", "hetero.coordinator.cli", "db", "upgrade"]
        refused = subprocess.run(
            [*upgrade, "--state-dir", str(state)], capture_output=True, text=True, timeout=60
        )
        assert refused.returncode != 0
        assert refused.stderr.startswith("error: another coordinator (pid 4242)"), refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        engine = connect(f"sqlite:///{db}")
        assert current_revision(engine) == older, "the schema was changed under the lock"
        engine.dispose()
    done = subprocess.run(
        [*upgrade, "--state-dir", str(state)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and f"schema revision {head()} (head)" in done.stdout, done


@pytest.mark.postgres
def test_a_second_coordinator_on_postgresql_waits_and_takes_over(pg_server) -> None:  # type: ignore[no-untyped-def]
    url = pg_server.new_database()
    first, first_port = create_server("127.0.0.1:0", Settings(db_url=url))
    first.start()
    second, second_port = create_server("127.0.0.1:0", Settings(db_url=url))
    second.start()
    try:
        assert _health(first_port) == SERVING and _health(second_port) == NOT_SERVING
        with pytest.raises(grpc.RpcError) as info:
            _nodes(second_port)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "standby" in (info.value.details() or "")
        _register(first_port, "n1")
        first.stop(0).wait()
        deadline = time.monotonic() + 30
        while _health(second_port) != SERVING:
            assert time.monotonic() < deadline, "the standby did not take over"
            time.sleep(0.2)
        assert _nodes(second_port) == ["n1"], "it serves the state the first one left"
    finally:
        first.stop(0).wait()
        second.stop(0).wait()
