"""Health tells the truth (issue #33): while the database takes no writes (here its disk
full, as SQLite's ``max_page_count`` makes it), the coordinator's health check answers
NOT_SERVING, the callers get RESOURCE_EXHAUSTED "out of disk space", and the log says
it once, not once a batch; once writes go through again, SERVING."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import event

from hetero.coordinator.database import open_database
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb
from tests.integration.conftest import Coordinator

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _health(c: Coordinator) -> int:
    stub = health_pb2_grpc.HealthStub(c.channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _until(c: Coordinator, status: int, within_s: float = 5.0) -> float:
    started = time.monotonic()
    while _health(c) != status:
        assert time.monotonic() - started < within_s, f"health not {status} in {within_s} s"
        time.sleep(0.05)
    return time.monotonic() - started


@contextmanager
def _disk_full(c: Coordinator) -> Iterator[None]:
    """Every new connection of the coordinator's may not grow the file past its size."""

    def cap(dbapi: object, _record: object) -> None:
        cursor = dbapi.cursor()  # type: ignore[attr-defined]
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    event.listen(c.engine, "connect", cap)
    c.engine.dispose()
    try:
        yield
    finally:
        event.remove(c.engine, "connect", cap)
        c.engine.dispose()


def _submit(c: Coordinator, i: int) -> None:
    """A write the caller waits for: a node's registration (its row and its device's)."""
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    request = pb.RegisterNodeRequest(name=f"n{i}", address="10.0.0.1", devices=[device])
    c.stub.RegisterNode(request, timeout=5)


def test_a_full_disk_turns_health_not_serving_until_writes_go_through(
    coordinator: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    assert _health(coordinator) == SERVING
    caplog.set_level(logging.ERROR, logger="hetero.coordinator.writer")
    with _disk_full(coordinator):
        codes = []
        for i in range(200):  # rows each, until the file is full
            try:
                _submit(coordinator, i)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                assert "out of disk space" in (exc.details() or "")
        assert codes and set(codes) <= {
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.UNAVAILABLE,
        }
        assert _until(coordinator, NOT_SERVING) < 5.0
        failures = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in failures]
    deadline = time.monotonic() + 30
    while True:  # the disk has room again; the reload after the last failure may still run
        try:
            _submit(coordinator, 999)
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "writes did not go through again"
            time.sleep(0.1)
    _until(coordinator, SERVING, within_s=30.0)  # a wait, not the 5 s bound


def _damage(db: Path) -> None:
    """Overwrite the header of every b-tree page but the first (the schema's) with an
    invalid page type, as a failing disk or a stray write would: SQLite then finds the
    tables' pages malformed when a write reaches them."""
    data = bytearray(db.read_bytes())
    size = int.from_bytes(data[16:18], "big") or 65536
    for page in range(1, len(data) // size):
        data[page * size : page * size + 8] = b"\xff" * 8
    db.write_bytes(bytes(data))


def test_a_damaged_database_turns_health_not_serving_and_is_said_once(
    coordinator: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 33: with page headers damaged, reads worked, every write failed INTERNAL, a
    traceback was logged about 4 times a second, and health said SERVING. Now the
    writes fail UNAVAILABLE, health is NOT_SERVING within 5 s and the writer's failure
    is logged once (then once a minute)."""
    _submit(coordinator, 0)
    assert _health(coordinator) == SERVING
    with coordinator.engine.connect() as connection:  # every committed page into the file
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    coordinator.engine.dispose()  # no connection keeps the good pages cached
    assert coordinator.db_path is not None
    _damage(coordinator.db_path)
    caplog.set_level(logging.INFO, logger="hetero.coordinator")
    codes = []
    started = time.monotonic()
    for i in range(1, 40):
        try:
            _submit(coordinator, i)
        except grpc.RpcError as exc:
            codes.append(exc.code())
        time.sleep(0.05)
    assert codes and set(codes) <= {grpc.StatusCode.UNAVAILABLE}, codes
    assert _until(coordinator, NOT_SERVING) < 5.0
    took = time.monotonic() - started
    said = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert 1 <= len(said) <= 10 * max(took / 60, 1), [r.getMessage() for r in said]
    assert not [r for r in said if r.exc_info], "a traceback was logged"


def test_a_coordinator_refuses_to_start_on_a_damaged_database_in_one_line(
    tmp_path: Path,
) -> None:
    db = tmp_path / "coordinator.db"
    engine = open_database(f"sqlite:///{db}")
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    _damage(db)
    argv = [sys.executable, "-m", "hetero.coordinator.cli", "serve", "--listen", "127.0.0.1:0"]
    argv += ["--state-dir", str(tmp_path / "state"), "--db", f"sqlite:///{db}"]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: database sqlite:///"), lines
    assert "is damaged (SQLite's quick_check:" in lines[0], lines
