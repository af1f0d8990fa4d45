"""The ``/metrics`` process's side (``metricsserver`` has the why): a bounded HTTP server
on the socket the coordinator bound, bodies asked of the coordinator over a pipe,
the snapshot's Prometheus text written here once per snapshot and the latency
histogram's from its counts, tokens checked by their SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from hetero.coordinator.metrics import CONTENT_TYPE, families, write
from hetero.coordinator.rpclatency import SAMPLE_NAMES, LatencyCounts
from hetero.coordinator.rpclatency import families as latency_families
from hetero.core import heap, procname
from hetero.security.auth import METADATA_KEY, SCHEME
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator.metrics")

#: Threads serving scrapes; a scrape is a cached text write, so a few suffice.
WORKERS = 4
#: Accepted connections that may wait for a worker. With every worker busy and this
#: many waiting, the process accepts nothing more until one is done: further clients
#: wait in the listening socket's backlog, then the kernel drops their connection
#: attempts (they retry on TCP's own back-off). No CPU of this process goes to them.
QUEUED = 8
#: Seconds a connection may take to send its request (and to read the answer).
READ_TIMEOUT_S = 2.0
#: Seconds the HTTP process serves its copy of the whole exposition before it asks the
#: coordinator again (a scrape finds it at most this much older than the caches').
REFRESH_S = 0.25
#: CPU niceness of the HTTP process over the coordinator's.
NICE = 10


#: Seconds between looks at whether the coordinator is still this process's parent.
PARENT_CHECK_S = 0.5


def exit_with_parent(parent: int) -> None:
    """End this process once ``parent`` is no longer its parent (it died: the process
    was handed to init or a subreaper)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _BoundedServer(HTTPServer):
    """``HTTPServer`` on a socket bound already, whose connections run on a fixed pool.
    With ``WORKERS + QUEUED`` connections in hand it stops accepting until one is done
    (``full`` counts the times), so a flood of connections waits in the kernel.

    Closing the surplus unread, as this server did first, cost a Python ``accept`` and
    ``close`` per connection: 200 clients that reconnect at once made 1,000 to 2,500
    a second, a tenth of a core or more of the coordinator's own cores."""

    def __init__(
        self, sock: socket.socket, handler: type[BaseHTTPRequestHandler], full: Any
    ) -> None:
        self.address_family = sock.family
        self._pool = futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="metrics")
        self._slots = threading.BoundedSemaphore(WORKERS + QUEUED)
        self.full = full
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock

    def verify_request(self, request: Any, client_address: Any) -> bool:
        # Called after each accept: hold this connection's slot, and do not return (so
        # ``serve_forever`` accepts nothing more) until there is one for the next.
        self._slots.acquire()
        if not self._slots.acquire(blocking=False):
            self.full.value += 1
            self._slots.acquire()
        self._slots.release()
        return True

    def process_request(self, request: Any, client_address: Any) -> None:
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


@dataclass(frozen=True)
class Answer:
    """The coordinator's answer to the HTTP process (pickled): the snapshot's build number
    and data (None: the one the HTTP process has), the latency histogram's counts (None:
    the coordinator keeps none), or ``ok`` False: it could not give them (logged there
    with the traceback)."""

    build: int = 0
    snapshot: bytes | None = None
    latency: LatencyCounts | None = None
    ok: bool = True

    def latency_text(self, names: frozenset[str] | None = None) -> bytes:
        """The histogram's exposition text (of the samples ``names`` where given)."""
        return b"" if self.latency is None else write(latency_families(self.latency), names)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def serve_http(
    sock: socket.socket, conn: Any, digests: list[bytes], full: Any, coordinator: int
) -> None:
    """The HTTP process: serve ``sock`` until the coordinator (pid ``coordinator``) exits,
    bodies from the coordinator over ``conn``."""
    exit_with_parent(coordinator)
    procname.set_name("hetero-metrics")
    os.nice(NICE)
    logging.basicConfig(level=logging.WARNING)
    heap.settle()
    bodies = _Bodies(conn)
    server = _BoundedServer(sock, _handler(bodies.get, digests), full)
    server.serve_forever()


class _Bodies:
    """The HTTP process's side of the pipe: the whole exposition, asked for again after
    ``REFRESH_S`` (the snapshot's families written here once per snapshot, the latency
    histogram at each refresh); the histogram's counts alone asked for at each scrape
    filtered to its samples. One question at a time."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._build = 0
        self._families = b""
        self._whole = b""
        self._asked_at = -float("inf")

    def get(self, names: frozenset[str] | None) -> bytes:
        with self._lock:
            if names is not None and names <= SAMPLE_NAMES:
                return self._ask(names).latency_text(names)
            if time.monotonic() - self._asked_at < REFRESH_S:
                return self._whole
            answer = self._ask(None)
            if answer.snapshot is not None:
                self._families = write(families(pb.ClusterSnapshot.FromString(answer.snapshot)))
                self._build = answer.build
            self._whole = self._families + answer.latency_text()
            self._asked_at = time.monotonic()
            return self._whole

    def _ask(self, names: frozenset[str] | None) -> Answer:
        self._conn.send((names, self._build))
        answer: Answer = self._conn.recv()
        if not answer.ok:
            raise RuntimeError("the coordinator could not write the metrics")
        return answer


def _handler(
    answer: Callable[[frozenset[str] | None], bytes], digests: list[bytes]
) -> type[BaseHTTPRequestHandler]:
    """Scrapes need a token whose SHA-256 is one of ``digests`` (none: open); ``answer``
    writes the body for the sample names of ``?name[]=`` (None: all)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S  # per socket read: a half-open connection is dropped

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path != "/metrics":
                self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")
                return
            if digests and not self._authorized():
                self._reply(401, "text/plain; charset=utf-8", b"unauthenticated: bearer token\n")
                return
            asked = urllib.parse.parse_qs(query).get("name[]")
            try:
                body = answer(frozenset(asked) if asked else None)
            except Exception as exc:  # the coordinator logged its side with the traceback
                log.warning("metrics scrape failed: %s", exc)
                self._reply(500, "text/plain; charset=utf-8", b"scrape failed, see the log\n")
                return
            self._reply(200, CONTENT_TYPE, body)

        def _authorized(self) -> bool:
            scheme, _, value = (self.headers.get(METADATA_KEY) or "").partition(" ")
            presented = digest(value.strip())
            matches = [hmac.compare_digest(presented, d) for d in digests]  # compare with all
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
