"""A real coordinator: gRPC server on port 0, SQLite file under tmp_path, real clients.

The store is SQLite unless a module overrides ``db_url`` with ``both_stores_url``:
then its tests run once on SQLite and once, marked ``postgres``, on a database of
a throwaway PostgreSQL server (``pgserver``) started once per session."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hetero.coordinator.database import session_factory
from hetero.coordinator.server import CoordinatorServer, Settings, create_server
from hetero.v1 import coordinator_pb2_grpc

# simcluster.py sits beside this file; --import-mode=importlib does not put it on sys.path.
sys.path.insert(0, str(Path(__file__).parent))
from handclock import Clock
from pgserver import PgServer, Unavailable
from simcluster import SimCluster
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

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
    """A coordinator started as ``serve()`` starts it (``create_server``), on a real database,
    with the clients a test talks to it through."""

    address: str
    #: The SQLite file; None on PostgreSQL (read ``engine`` instead).
    db_path: Path | None
    engine: Engine
    stub: coordinator_pb2_grpc.CoordinatorStub
    channel: grpc.Channel
    clock: Clock
    server: CoordinatorServer
    settings: Settings

    @property
    def sessions(self) -> sessionmaker[Session]:
        """Sessions on its database (what it wrote; a test that writes rows itself then
        calls ``restart``, as an operator's tool would be followed by a restart)."""
        return session_factory(self.engine)

    def flush(self) -> None:
        """Wait until every write the coordinator has queued is committed (a heartbeat's
        are not waited for by its call)."""
        self.server.flush()

    def sweep(self) -> None:
        """One sweep of the coordinator's, now (at the hand clock's time)."""
        self.server.sweep()

    def reconfigure(self, **changes: object) -> None:
        """Restart it with ``changes`` to its settings (``Settings``' fields)."""
        self.settings = dataclasses.replace(self.settings, **changes)  # type: ignore[arg-type]
        self.restart()

    def restart(self) -> None:
        """Stop it and start another on the same database and port: it loads its state."""
        self.channel.close()
        self.server.stop(0).wait()
        port = self.address.rsplit(":", 1)[1]
        self.server, _ = create_server(f"127.0.0.1:{port}", self.settings)
        self.server.start()
        self.engine = self.server.engine
        self.channel = grpc.insecure_channel(self.address)
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)


def hand_clocked(db_url: str, clock: Clock, **settings: object) -> Settings:
    """Settings of a coordinator on ``clock``, moved by hand: node health follows it, and
    the sweeper, on a clock that stands still, sweeps when the test says
    (``Coordinator.sweep``) rather than at moments the test cannot see."""
    return Settings(
        db_url=db_url,
        clock=clock,
        heartbeat_timeout_s=10.0,
        sweep_period_s=3600.0,
        **settings,  # type: ignore[arg-type]
    )


def start_coordinator(settings: Settings, clock: Clock) -> Coordinator:
    server, port = create_server("127.0.0.1:0", settings)
    server.start()
    address = f"127.0.0.1:{port}"
    engine = server.engine
    db_path = Path(engine.url.database or "") if engine.dialect.name == "sqlite" else None
    channel = grpc.insecure_channel(address)
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    return Coordinator(address, db_path, engine, stub, channel, clock, server, settings)


@pytest.fixture
def coordinator(db_url: str) -> Iterator[Coordinator]:
    clock = Clock()
    c = start_coordinator(hand_clocked(db_url, clock), clock)
    try:
        yield c
    finally:
        c.channel.close()
        c.server.stop(0).wait()


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
    """The base URL of ``coordinator``'s ``/metrics`` (port 0), as ``hetero-coord serve
    --metrics-listen`` serves it: on the coordinator's loop, stopped with it."""
    port = coordinator.server.serve_metrics("127.0.0.1:0")
    yield f"http://127.0.0.1:{port}"
