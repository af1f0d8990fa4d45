"""A real coordinator: gRPC server on port 0, SQLite file under tmp_path, real clients.

The store is SQLite unless a module overrides ``db_url`` with ``both_stores_url``:
then its tests run once on SQLite and once, marked ``postgres``, on a database of
a throwaway PostgreSQL server (``pgserver``) started once per session."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.metricsserver import MetricsServer
from hetero.coordinator.server import create_server
from hetero.coordinator.service import CoordinatorService, Deps
from hetero.v1 import coordinator_pb2_grpc

# simcluster.py sits beside this file; --import-mode=importlib does not put it on sys.path.
sys.path.insert(0, str(Path(__file__).parent))
from handclock import Clock
from pgserver import PgServer, Unavailable
from simcluster import SimCluster
from sqlalchemy import Engine

#: The stores a ``both_stores_url`` test runs on.
STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the session; skips (one line) where none can run."""
    try:
        server = PgServer()
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """The coordinator's database: a SQLite file under ``tmp_path``."""
    return f"sqlite:///{tmp_path / 'coordinator.db'}"


@pytest.fixture(params=STORES)
def both_stores_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on each store: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'coordinator.db'}"
    server: PgServer = request.getfixturevalue("pg_server")
    return server.new_database()


@dataclass
class Coordinator:
    address: str
    #: The SQLite file; None on PostgreSQL (read ``engine`` instead).
    db_path: Path | None
    engine: Engine
    stub: coordinator_pb2_grpc.CoordinatorStub
    channel: grpc.Channel
    clock: Clock
    deps: Deps


@pytest.fixture
def coordinator(db_url: str) -> Iterator[Coordinator]:
    engine = open_database(db_url)
    db_path = Path(engine.url.database or "") if engine.dialect.name == "sqlite" else None
    clock = Clock()
    deps = Deps(sessions=session_factory(engine), clock=clock, heartbeat_timeout_s=10.0)
    server, port = create_server("127.0.0.1:0", deps)
    server.start()
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address)
    try:
        yield Coordinator(
            address,
            db_path,
            engine,
            coordinator_pb2_grpc.CoordinatorStub(channel),
            channel,
            clock,
            deps,
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


@pytest.fixture
def metrics(coordinator: Coordinator) -> Iterator[str]:
    """The base URL of a ``/metrics`` server on ``coordinator``'s snapshot and RPC
    latency histogram (port 0), as ``hetero-coord serve --metrics-listen`` wires it."""
    deps = coordinator.deps
    server = MetricsServer(
        "127.0.0.1:0", CoordinatorService(deps).snapshot, rpc_latency=deps.rpc_latency
    )
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
