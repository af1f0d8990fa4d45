"""A real coordinator: gRPC server on port 0, SQLite file under tmp_path, real clients."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.server import create_server
from hetero.coordinator.service import Deps
from hetero.v1 import coordinator_pb2_grpc

# simcluster.py sits beside this file; --import-mode=importlib does not put it on sys.path.
sys.path.insert(0, str(Path(__file__).parent))
from simcluster import SimCluster


class Clock:
    """Wall-clock seconds the test moves by hand (node health depends on it)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class Coordinator:
    address: str
    db_path: Path
    stub: coordinator_pb2_grpc.CoordinatorStub
    channel: grpc.Channel
    clock: Clock
    deps: Deps


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    db_path = tmp_path / "coordinator.db"
    engine = open_database(f"sqlite:///{db_path}")
    clock = Clock()
    deps = Deps(sessions=session_factory(engine), clock=clock, heartbeat_timeout_s=10.0)
    server, port = create_server("127.0.0.1:0", deps)
    server.start()
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address)
    try:
        yield Coordinator(
            address, db_path, coordinator_pb2_grpc.CoordinatorStub(channel), channel, clock, deps
        )
    finally:
        channel.close()
        deps.stopping.set()
        server.stop(0).wait()
        engine.dispose()


@pytest.fixture
def sim(coordinator: Coordinator) -> Iterator[SimCluster]:
    """Simulated agents and trainers talking to ``coordinator`` over real gRPC."""
    cluster = SimCluster(coordinator.address)
    try:
        yield cluster
    finally:
        cluster.close()
