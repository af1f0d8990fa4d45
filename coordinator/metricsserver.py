"""The coordinator's ``/metrics`` over HTTP: an ``aiohttp`` server on the coordinator's own
event loop, bounded, and the listen rule.

Why on the loop, and why ``aiohttp``: the loop owns the cluster state, so the exposition
(``metrics``) reads it there without a copy, a lock or a pipe; and an asyncio server is
cooperative, so a scrape storm is callbacks queued between the heartbeats', never a
thread that takes the interpreter from the loop mid-callback. Both earlier shapes
failed that way: ``prometheus_client.start_http_server`` is a thread per connection
with no limit and no read timeout (200 half-open connections piled up threads, issue
17), and its threads in the coordinator's process took the interpreter lock the loop
answering heartbeats needs; the cure was a separate HTTP process fed snapshots over a
pipe, ~800 lines of its own. What made a scrape expensive is gone besides: the
per-device telemetry of 1,000 nodes (0.3 s to write) is each agent's to serve now.

Bounds, whatever the clients do:

- The answer's bytes are built at most once per ``TTL_S`` for each query (the whole
  exposition, or one ``?name[]=`` filter; at most ``KEPT`` kept): a scrape in between
  gets the cached bytes. ``?name[]=NAME&name[]=...`` is prometheus-client's own filter
  (``restricted_registry``: only the collectors that declare those names are
  collected, so ``hetero-bench load``'s reads of the latency histogram's buckets do not
  collect the cluster).
- At most ``CONCURRENT`` scrapes are answered at once and at most ``RATE`` start a
  second, spaced ``1 / RATE`` apart; at most ``WAITING`` wait for their turn, and any
  beyond get ``503`` with ``Retry-After: 1`` after ``REFUSE_S``. A real Prometheus
  scrapes a target every 15 s by default (every 5 s at the shortest usual setting):
  ``RATE`` = 20 a second leaves room for a hundred such servers before any waits, and
  keeps a storm's answered scrapes to a few ms of the loop a second. A waiting scrape
  costs a timer; a refusal costs the loop a request's parse and answer, so it is held
  back a second: a client that asks again at once asks at most once a second. Answered
  at once, 200 clients in a loop made ~750 refusals a second under ``hetero-bench load
  --scrapers 200`` (2-core box), and the heartbeats' p50 as the agents saw it went from
  3 to 33 ms.
- A connection that has sent no complete request ``READ_TIMEOUT_S`` after it opened,
  or after its previous answer, is closed: ``aiohttp``'s ``keepalive_timeout`` starts
  at ``connection_made`` and closes a connection whose handler still waits for a
  request (``web_protocol.RequestHandler``), half-open ones included. So each connection
  costs a socket and a small protocol object for at most that long; the listening
  socket's backlog (``BACKLOG``) bounds the ones the kernel holds before accepting.

The listen rule is gRPC's (``hetero.security.transport.check_listen``): loopback by
default, and a non-loopback address needs the coordinator's token, which every scrape
must then carry (``Authorization: Bearer``, Prometheus'
``authorization: {credentials_file: ...}``), or a read role's token, or ``--insecure``.
Loopback scrapes need no token: the figures are read-only and carry no spec, command
or log. Tokens are kept as their SHA-256 digests and compared with all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections import OrderedDict

from aiohttp import web
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from hetero.core.errors import ConfigError
from hetero.security.auth import METADATA_KEY, SCHEME
from hetero.security.transport import ServerSecurity, is_loopback

log = logging.getLogger("hetero.coordinator.metrics")

#: What ``generate_latest`` writes (newer prometheus-client names 1.0.0 its "latest").
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds an answer's bytes are served before they are built again, at least.
TTL_S = 1.0
#: Distinct queries whose answers are kept (the whole exposition is one).
KEPT = 8
#: Scrapes answered at once.
CONCURRENT = 4
#: Scrapes started a second, at most, over all clients.
RATE = 20.0
#: Scrapes that may wait for their turn; beyond, 503 after ``REFUSE_S``.
WAITING = 64
#: Seconds a refused scrape waits for its 503.
REFUSE_S = 1.0
#: Seconds a connection may stay without a complete request.
READ_TIMEOUT_S = 2.0
#: Connections the kernel may hold before the server accepts them.
BACKLOG = 64


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


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class MetricsServer:
    """``/metrics`` of ``registry`` on ``address`` (``host:port``; port 0 = any free
    port), bounded as the module says. ``start`` and ``stop`` run on the event loop
    that owns what the registry reads; ``port`` is the bound port once started."""

    def __init__(
        self, address: str, registry: CollectorRegistry, security: ServerSecurity | None = None
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"metrics_listen must be host:port, got {address!r}")
        security = security or ServerSecurity()
        check_metrics_listen(address, security)
        # Beyond loopback a scrape sends the cluster token or the read role's.
        readers = [r.token for r in security.roles if r.role == "read"]
        tokens = [] if is_loopback(address) else [*filter(None, [security.token]), *readers]
        self._digests = [_digest(t.reveal()) for t in tokens]
        self.address = address
        self._host = host.strip("[]") or "0.0.0.0"
        self._port = int(port)
        self.port = 0
        self.registry = registry
        #: Answers by query (None: the whole exposition): (built at, bytes).
        self._kept: OrderedDict[frozenset[str] | None, tuple[float, bytes]] = OrderedDict()
        #: Times an answer was built (tests read it).
        self.builds = 0
        self._slots = asyncio.Semaphore(CONCURRENT)
        self._waiting = 0
        self._next_at = 0.0
        app = web.Application()
        app.router.add_get("/metrics", self._scrape)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,  # a scrape every few seconds would flood journald
            keepalive_timeout=READ_TIMEOUT_S,
            shutdown_timeout=1.0,
        )

    async def start(self) -> None:
        """Bind and serve; a wrong address fails here, in one line."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, backlog=BACKLOG)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(
                f"cannot listen for metrics on {self.address}: {exc.strerror}"
            ) from None
        server = site._server  # the asyncio server: its socket has the port 0 chose
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await self._runner.cleanup()

    @property
    def connections(self) -> int:
        """Connections the server holds now (accepted, not yet closed)."""
        server = self._runner.server
        return 0 if server is None else len(server.connections)

    async def _scrape(self, request: web.Request) -> web.StreamResponse:
        if self._digests and not self._authorized(request.headers.get(METADATA_KEY, "")):
            return web.Response(
                status=401,
                text="unauthenticated: bearer token\n",
                headers={"WWW-Authenticate": SCHEME},
            )
        if self._waiting >= WAITING:
            await asyncio.sleep(REFUSE_S)
            return web.Response(status=503, text="busy, try again\n", headers={"Retry-After": "1"})
        asked = request.query.getall("name[]", [])
        names = frozenset(asked) if asked else None
        self._waiting += 1
        try:
            async with self._slots:
                await self._turn()
                response = web.Response(body=self._answer(names))
                response.headers["Content-Type"] = CONTENT_TYPE
                # A client that left while it waited (a cut scrape) is routine, not an
                # error with a traceback in the log at every one.
                with contextlib.suppress(ConnectionResetError):
                    await response.prepare(request)
                    await response.write_eof()
                return response
        finally:
            self._waiting -= 1

    async def _turn(self) -> None:
        """Wait for this scrape's slot in the ``RATE`` a second (taken before waiting)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        at = max(now, self._next_at)
        self._next_at = at + 1.0 / RATE
        if at > now:
            await asyncio.sleep(at - now)

    def _answer(self, names: frozenset[str] | None) -> bytes:
        now = asyncio.get_running_loop().time()
        kept = self._kept.get(names)
        if kept is not None and now - kept[0] < TTL_S:
            return kept[1]
        registry = self.registry if names is None else self.registry.restricted_registry(names)
        data: bytes = generate_latest(registry)
        self.builds += 1
        self._kept[names] = (now, data)
        self._kept.move_to_end(names)
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)
        return data

    def _authorized(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        presented = _digest(value.strip())
        matches = [hmac.compare_digest(presented, d) for d in self._digests]  # compare with all
        return scheme.lower() == SCHEME.lower() and any(matches)
