"""The HTTP side of ``/metrics``: a bounded server, the shared cluster snapshot, the RPC
latency histogram beside it, the listen rule.

Why not ``prometheus_client.start_http_server``: it starts a thread per
connection with no limit and no read timeout, which is what let 200 half-open
connections pile up threads and, with a snapshot per scrape, exhaust the
coordinator's database pool (issue 17). Here ``metricshttp.WORKERS`` threads serve
connections, at most ``QUEUED`` more wait, and any beyond are closed at
once; a connection that sends no complete request within
``metricshttp.READ_TIMEOUT_S`` is dropped. Whatever the scrape rate, the cluster
snapshot is the coordinator's shared one (``snapshots.Snapshots``: built at most
once a second and at most a tenth of the time, in a worker process of its own
where there is one), so scrapers cost the database at most one read a second.

The RPC latency histogram (``rpclatency``) follows the snapshot's families in
every answer. The coordinator copies its counts (about 20 µs) and the HTTP
process writes them as text, at each of its refreshes: writing them in the
coordinator's process took 6.5 ms of its interpreter every quarter second under
a scrape storm. ``?name[]=NAME&name[]=...`` (prometheus-client's own filter)
naming only the histogram's samples (``hetero_rpc_duration_seconds_bucket``,
``_count``, ``_sum``, ``_created``) answers those alone and does not read the
snapshot: that is how ``hetero-bench load`` reads the coordinator's own latency at
the edges of its window without a snapshot's cost inside it. Any other filter gets
the whole exposition: filtering the cluster's families would cost a pass over them
at every such scrape, outside the bounds above.

The HTTP side runs in a process of its own (``spawn``, started by ``start``): a
scrape storm is sockets to accept, read, time out and close, hundreds a second,
and in the coordinator's process every one of them took the interpreter lock
the event loop answering heartbeats needs (under ``hetero-bench load --scrapers
200`` on a 2-core box the coordinator's own GetPlan p99 went from 0.3 to 128 ms
and the heartbeats' p99 seen by the agents rose eightfold). The coordinator binds
the socket, so a wrong address fails at once and port 0 has its port, and hands
it to the process; that process asks the coordinator over a pipe at most every
``metricshttp.REFRESH_S`` for the snapshot (serialized, sent only when it is a new one)
and the histogram's counts, and for the counts alone at each scrape filtered to
them. It writes the snapshot's Prometheus families itself, once per snapshot
(about 0.3 s of Python for 1,000 nodes and 1,000 jobs, which in the coordinator's
process stalled the heartbeats), and serves the text meanwhile from its copy. It
runs at a lower CPU priority (``metricshttp.NICE``): on a host with cores to spare that
changes nothing, on a busy one the kernel gives the coordinator the CPU first. It
checks tokens against their SHA-256 digests and never holds a token. It exits
within a second of a ``kill -9`` of the coordinator; one that dies is started
again, logged.

The listen rule is gRPC's (``hetero.security.transport.check_listen``): loopback by
default, and a non-loopback address needs the coordinator's token, which every
scrape must then carry (``Authorization: Bearer``, Prometheus'
``authorization: {credentials_file: ...}``), or ``--insecure``. Loopback scrapes
need no token: the figures are read-only and carry no spec, command or log.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from hetero.coordinator.metricshttp import Answer, digest, serve_http
from hetero.coordinator.rpclatency import SAMPLE_NAMES, RpcLatency
from hetero.coordinator.snapshots import TTL_S, Snapshots
from hetero.core.errors import ConfigError
from hetero.security.transport import ServerSecurity, is_loopback
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator.metrics")

#: Seconds between starts of an HTTP process that keeps dying.
RESTART_S = 1.0


def check_metrics_listen(address: str, security: ServerSecurity) -> None:
    """Refuse a non-loopback ``address`` unless scrapes must carry the token, or
    ``--insecure``; one line naming what to do."""
    if is_loopback(address) or security.token is not None:
        return
    if any(r.role == "read" for r in security.roles):
        return
    if not security.insecure:
        raise ConfigError(
            f"refusing to serve /metrics on {address} without authentication: give a token "
            "(--token-file or $HETERO_TOKEN_FILE; scrapes then send it as a bearer token), "
            "bind it to loopback, or --insecure on a trusted network"
        )
    log.warning("/metrics on %s is readable by anyone who can reach it (--insecure)", address)


class MetricsServer:
    """``/metrics`` over HTTP from a process of its own, bounded as the module says, of
    ``snapshots`` (the coordinator's shared ones, or a function building a snapshot,
    kept ``ttl_s``). ``security`` decides the listen rule and whether scrapes need the
    token; ``rpc_latency`` (the coordinator's ``Deps.rpc_latency``) follows the snapshot."""

    def __init__(
        self,
        address: str,
        snapshots: Snapshots | Callable[[], pb.ClusterSnapshot],
        security: ServerSecurity | None = None,
        *,
        ttl_s: float = TTL_S,
        rpc_latency: RpcLatency | None = None,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"metrics_listen must be host:port, got {address!r}")
        security = security or ServerSecurity()
        check_metrics_listen(address, security)
        # Beyond loopback a scrape sends the cluster token or the read role's.
        readers = [r.token for r in security.roles if r.role == "read"]
        tokens = [] if is_loopback(address) else [*filter(None, [security.token]), *readers]
        self._digests = [digest(t.reveal()) for t in tokens]
        if not isinstance(snapshots, Snapshots):
            snapshots = Snapshots.of(snapshots, ttl_s)
        self.snapshots = snapshots
        self.latency = rpc_latency
        host = host.strip("[]") or "0.0.0.0"
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, int(port)))
            self._sock.listen(64)  # the backlog beyond the pool and its queue
        except OSError as exc:
            self._sock.close()
            raise ConfigError(f"cannot listen for metrics on {address}: {exc.strerror}") from None
        self.port: int = self._sock.getsockname()[1]
        self._context = multiprocessing.get_context("spawn")
        self._full = self._context.Value("q", 0, lock=False)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._process: Any = None
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)

    def answer(self, asked: tuple[frozenset[str] | None, int]) -> Answer:
        """What the HTTP process asked for: ``(names, build)``. Names all of the latency
        histogram's samples: its counts alone. Else the current snapshot's number, its
        data unless it is ``build`` (the HTTP process has it), and the counts."""
        names, have = asked
        latency = self.latency.counts() if self.latency is not None else None
        if names is not None and names <= SAMPLE_NAMES:
            return Answer(latency=latency)
        number, data = self.snapshots.latest()
        return Answer(number, None if number == have else data, latency)

    @property
    def full(self) -> int:
        """Times the HTTP process stopped accepting connections because every worker and
        queue slot was taken (until one was free)."""
        return int(self._full.value)

    def pid(self) -> int | None:
        """The HTTP process's id while one runs (for tests and logs)."""
        with self._lock:
            return None if self._process is None else self._process.pid

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            process = self._process
        if process is not None:
            process.terminate()
        self._thread.join(timeout=5.0)
        self._sock.close()

    def _run(self) -> None:
        """Start the HTTP process and answer its requests for bodies; start another when
        it dies, until ``stop``."""
        while not self._stopping.is_set():
            ours, theirs = self._context.Pipe()
            process = self._context.Process(
                target=serve_http,
                args=(self._sock, theirs, self._digests, self._full, os.getpid()),
                name="hetero-metrics",
                daemon=True,
            )
            with self._lock:
                if self._stopping.is_set():
                    return
                failed: OSError | None = None
                try:
                    process.start()
                except OSError as exc:  # out of processes or memory: the host's, for now
                    failed = exc
                else:
                    self._process = process
            if failed is not None:
                ours.close()
                theirs.close()
                log.warning("cannot start the /metrics process (%s); trying again", failed)
                self._stopping.wait(RESTART_S)
                continue
            theirs.close()
            self._answer(ours)
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
            if not self._stopping.is_set():
                log.warning(
                    "the /metrics process exited (code %s); starting another", process.exitcode
                )
                self._stopping.wait(RESTART_S)

    def _answer(self, conn: Any) -> None:
        """The bodies the HTTP process asks for, until it exits."""
        while True:
            try:
                asked = conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply = self.answer(asked)
            except Exception:
                log.exception("metrics scrape failed")
                reply = Answer(ok=False)
            try:
                conn.send(reply)
            except OSError:
                return
