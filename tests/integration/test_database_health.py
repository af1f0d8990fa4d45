"""Health tells the truth (issue #33): while the database takes no writes (here its disk
full, as SQLite's ``max_page_count`` makes it), the coordinator's health check answers
NOT_SERVING, the callers get RESOURCE_EXHAUSTED "out of disk space", and the log says
it once, not once a batch; once writes go through again, SERVING."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import event

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
    deadline = time.monotonic() + 5
    while True:  # the disk has room again; the reload after the last failure may still run
        try:
            _submit(coordinator, 999)
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "writes did not go through again"
            time.sleep(0.1)
    _until(coordinator, SERVING)
