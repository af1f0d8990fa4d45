"""The HTTP side of ``/metrics``: the registry of ``metrics.CoordinatorMetrics`` served by
``prometheus-client``'s own WSGI application on its threading server, on a daemon
thread of the coordinator's process (never on the event loop), and the listen rule.

A scrape costs the process the text of a small registry (the RPC histogram, two
counters a job) and, at most once per ``snapshots.TTL_S``, a cluster snapshot that
the loop builds from memory; the loop's heartbeats are measured beside 200 scraping
and half-open clients by ``hetero-bench load --scrapers``. A connection that sends no
complete request within :data:`READ_TIMEOUT_S` is closed, so half-open connections
hold a thread each for that long at most.

The listen rule is gRPC's (``hetero.security.transport.check_listen``): loopback by
default; beyond it every scrape must carry the coordinator's token or a ``read``
role's (``Authorization: Bearer``, Prometheus' ``authorization: {credentials_file:
...}``), else ``--insecure``. Tokens are compared as SHA-256 digests in constant
time; the server keeps no token. Loopback scrapes need no token: the figures are
read-only and carry no spec, command or log.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

from hetero.coordinator.metrics import CoordinatorMetrics
from hetero.coordinator.snapshots import TTL_S, Snapshots
from hetero.core.errors import ConfigError
from hetero.security.transport import ServerSecurity, is_loopback
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator.metrics")

#: Seconds a connection may take to send its request before it is closed.
READ_TIMEOUT_S = 5.0


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
    """``/metrics`` of ``metrics`` on ``address`` (``host:port``; port 0 = any), with the
    cluster of ``snapshots`` (or of a function building a snapshot, kept ``ttl_s``).
    ``security`` decides the listen rule and whether scrapes need a token; a connection
    is closed ``read_timeout_s`` after it opened without a whole request."""

    def __init__(
        self,
        address: str,
        snapshots: Snapshots | Callable[[], pb.ClusterSnapshot],
        security: ServerSecurity | None = None,
        *,
        metrics: CoordinatorMetrics | None = None,
        ttl_s: float = TTL_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"metrics_listen must be host:port, got {address!r}")
        security = security or ServerSecurity()
        check_metrics_listen(address, security)
        readers = [r.token for r in security.roles if r.role == "read"]
        tokens = [] if is_loopback(address) else [*filter(None, [security.token]), *readers]
        digests = [_digest(t.reveal()) for t in tokens]
        if not isinstance(snapshots, Snapshots):
            snapshots = Snapshots.of(snapshots, ttl_s)
        self.snapshots = snapshots
        self.metrics = metrics or CoordinatorMetrics()
        self.metrics.attach(snapshots)
        app = _guarded(make_wsgi_app(self.metrics.registry), digests)
        server_class = _Server6 if ":" in host.strip("[]") else _Server
        try:
            self._httpd = make_server(
                host.strip("[]") or "0.0.0.0",
                int(port),
                app,
                server_class=server_class,
                handler_class=type("Handler", (_Handler,), {"timeout": read_timeout_s}),
            )
        except OSError as exc:
            raise ConfigError(f"cannot listen for metrics on {address}: {exc.strerror}") from None
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5.0)
        self._httpd.server_close()


class _Server(ThreadingWSGIServer):  # type: ignore[misc, unused-ignore]
    daemon_threads = True
    request_queue_size = 128  # the listen backlog: socketserver's 5 drops a burst's SYNs

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or hung up is routine here, not a traceback on stderr.
        log.debug("metrics connection from %s failed", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S  # no request within it: the connection is closed

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (prometheus-client's own handler is silent too)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _guarded(app: Any, digests: list[bytes]) -> Any:
    """``app`` at ``/metrics`` only, behind the bearer tokens of ``digests`` if any."""

    def guarded(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: /metrics only\n"]
        if digests:
            scheme, _, token = str(environ.get("HTTP_AUTHORIZATION", "")).partition(" ")
            given = _digest(token.strip()) if scheme.lower() == "bearer" else b""
            if not any(hmac.compare_digest(given, d) for d in digests):
                start_response(
                    "401 Unauthorized",
                    [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")],
                )
                return [b"unauthenticated: send the coordinator's token as a bearer token\n"]
        result: Iterable[bytes] = app(environ, start_response)
        return result

    return guarded
