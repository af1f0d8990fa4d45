"""The HTTP side of ``/metrics``: a bounded server, a cached snapshot, the listen rule.

Why not ``prometheus_client.start_http_server``: it starts a thread per
connection with no limit and no read timeout, which is what let 200 half-open
connections pile up threads and, with a snapshot per scrape, exhaust the
coordinator's database pool (issue 17). Here :data:`WORKERS` threads serve
connections, at most :data:`QUEUED` more wait, and any beyond are closed at
once; a connection that sends no complete request within
:data:`READ_TIMEOUT_S` is dropped. Whatever the scrape rate, the cluster
snapshot is built at most once per :data:`SNAPSHOT_TTL_S` and at most
:data:`BUILD_SHARE` of the time (one builder at a time; other scrapes get the
cached text), so scrapers cost the database at most one read a second and the
interpreter lock the heartbeats need at most a tenth of it.

The listen rule is gRPC's (``hetero.transport.check_listen``): loopback by
default, and a non-loopback address needs the coordinator's token, which every
scrape must then carry (``Authorization: Bearer``, Prometheus'
``authorization: {credentials_file: ...}``), or ``--insecure``. Loopback scrapes
need no token: the figures are read-only and carry no spec, command or log.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from hetero.auth import METADATA_KEY, SCHEME, Secret
from hetero.coordinator.metrics import CONTENT_TYPE, render
from hetero.core.errors import ConfigError
from hetero.transport import ServerSecurity, is_loopback
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator.metrics")

#: Threads serving scrapes; a scrape is a cached text write, so a few suffice.
WORKERS = 4
#: Accepted connections that may wait for a worker; more are closed at once.
QUEUED = 8
#: Seconds a connection may take to send its request (and to read the answer).
READ_TIMEOUT_S = 2.0
#: Seconds a built exposition is served before the snapshot is read again, at least.
SNAPSHOT_TTL_S = 1.0
#: Most of the time the snapshot's builds may take: a build that took B seconds is
#: served for at least B / BUILD_SHARE. With 1,000 nodes and 1,000 jobs (a long
#: queue) one build took seconds of CPU on a 2-core box, all of it on the interpreter
#: lock that answers heartbeats; rebuilt every second it would never let go.
BUILD_SHARE = 0.1


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


class CachedExposition:
    """The exposition text of ``snapshot()``, rebuilt at most once per ``ttl_s`` and at
    most ``BUILD_SHARE`` of the time (a slow build is served for longer)."""

    def __init__(
        self,
        snapshot: Callable[[], pb.ClusterSnapshot],
        ttl_s: float = SNAPSHOT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._snapshot = snapshot
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._body = b""
        self._built_at = -float("inf")
        self._build_s = 0.0
        #: Snapshots built so far (what the scrape rate costs the database).
        self.builds = 0

    def body(self) -> bytes:
        with self._lock:  # one builder; concurrent scrapes wait for it, then share it
            if self._clock() - self._built_at >= max(self._ttl_s, self._build_s / BUILD_SHARE):
                started = self._clock()
                self._body = render(self._snapshot()).encode("utf-8")
                self._built_at = self._clock()
                self._build_s = self._built_at - started
                self.builds += 1
            return self._body


class _BoundedServer(HTTPServer):
    """``HTTPServer`` whose connections run on a fixed pool; beyond ``WORKERS + QUEUED``
    in flight, a new connection is closed without being read."""

    request_queue_size = 64  # listen backlog

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self._pool = futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="metrics")
        self._slots = threading.BoundedSemaphore(WORKERS + QUEUED)
        #: Connections closed unread because the pool and its queue were full.
        self.refused = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        self._pool.submit(self._serve_one, request, client_address)

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or hung up is routine here, not a traceback on stderr.
        log.debug("metrics connection from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class MetricsServer:
    """``/metrics`` over HTTP from a daemon thread, bounded as the module says.
    ``security`` decides the listen rule and whether scrapes need the token."""

    def __init__(
        self,
        address: str,
        snapshot: Callable[[], pb.ClusterSnapshot],
        security: ServerSecurity | None = None,
        *,
        ttl_s: float = SNAPSHOT_TTL_S,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"metrics_listen must be host:port, got {address!r}")
        security = security or ServerSecurity()
        check_metrics_listen(address, security)
        # Beyond loopback a scrape sends the cluster token or the read role's.
        readers = [r.token for r in security.roles if r.role == "read"]
        tokens = [] if is_loopback(address) else [*filter(None, [security.token]), *readers]
        self.exposition = CachedExposition(snapshot, ttl_s)
        try:
            self._httpd = _BoundedServer(
                (host.strip("[]") or "0.0.0.0", int(port)), _handler(self.exposition, tokens)
            )
        except OSError as exc:
            raise ConfigError(f"cannot listen for metrics on {address}: {exc.strerror}") from None
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics", daemon=True
        )

    @property
    def refused(self) -> int:
        """Connections closed unread because every worker and queue slot was taken."""
        return self._httpd.refused

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)


def _handler(exposition: CachedExposition, tokens: list[Secret]) -> type[BaseHTTPRequestHandler]:
    """Scrapes need one of ``tokens`` (none: open)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S  # per socket read: a half-open connection is dropped

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")
                return
            if tokens and not self._authorized(tokens):
                self._reply(401, "text/plain; charset=utf-8", b"unauthenticated: bearer token\n")
                return
            try:
                body = exposition.body()
            except Exception:
                log.exception("metrics scrape failed")
                self._reply(500, "text/plain; charset=utf-8", b"scrape failed, see the log\n")
                return
            self._reply(200, CONTENT_TYPE, body)

        def _authorized(self, expected: list[Secret]) -> bool:
            scheme, _, value = (self.headers.get(METADATA_KEY) or "").partition(" ")
            matches = [t.matches(value.strip()) for t in expected]  # compare with all
            return scheme.lower() == SCHEME.lower() and any(matches)

        def _reply(self, code: int, content_type: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if code == 401:
                self.send_header("WWW-Authenticate", SCHEME)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            # Scrapes every few seconds would flood journald at INFO.
            log.debug("%s " + format, self.address_string(), *args)

    return Handler
