"""Round trip and bandwidth between two agents' hosts: the link a job's all-reduce crosses.

The profile's other network figures are to the coordinator, which no gradient
ever crosses. This probe runs between two nodes: one agent serves
(:class:`PeerProbeServer`, on an ephemeral TCP port unless one is configured, for as
long as the agent runs, ``agent.peerlinks``), the other connects (:func:`measure_peer`)
and times

- the round trip of one-byte pings (median of a few), and
- a transfer of ``probe_bytes`` each way: bytes sent / (time − one round trip),
  the best of two.

**Why plain TCP, not a timed Gloo all-reduce.** Gloo's ring all-reduce between
two ranks is itself a TCP transfer each way, so the socket figures are what it
is built from, and :func:`hetero.core.balancer.allreduce.ring_all_reduce_s`
turns them into a step's all-reduce for any world size and gradient size. A
Gloo group would need torch and a rendezvous in the long-running agent, ties
both agents into one process group whose failure (a peer gone mid-probe)
aborts in C++, and measures one world size and one tensor size only. The
socket probe is the standard library, fails as an ``OSError`` and costs a few
MiB each way.

A peer proves it was sent by the coordinator with ``token``: random bytes the
serving agent makes at start and gives the coordinator alone, which hands them to
the agent it orders to measure the link (``coordinator.peerlinks``). A connection
that does not open with it is closed unread, and no request may ask for more than
``max_bytes``: a stranger who finds the port gets nothing, and cannot make the
node send more than that per request. The token must arrive whole within
:data:`TOKEN_DEADLINE_S` of the connection: the server answers one connection at a
time, so a stranger who connects and sends nothing, or a byte now and then, would
otherwise hold it for as long as each read's timeout allows, and the probe the
coordinator ordered would fail behind it.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import statistics
import struct
import threading
import time
from dataclasses import dataclass

from hetero.core.peerlinks import TOKEN_BYTES

#: Bytes each way: megabytes dominate a LAN's round trip, and cost well under a
#: second on any link a job would span.
PROBE_BYTES = 4 * 1024 * 1024

#: Seconds a connection has to send the whole token (a peer sends it at once).
TOKEN_DEADLINE_S = 2.0

_REQUEST = struct.Struct("!cQ")  # operation, byte count
_PING, _UPLOAD, _DOWNLOAD = b"p", b"u", b"d"
_CHUNK = 256 * 1024


@dataclass(frozen=True)
class PeerLink:
    """One node-to-node link as measured from this node. Seconds; bytes per second;
    ``None`` where the transfer was too fast to time against the round trip."""

    peer: str
    rtt_s: float
    send_bytes_per_s: float | None
    receive_bytes_per_s: float | None

    @property
    def bytes_per_s(self) -> float | None:
        """The slower direction: a ring all-reduce sends and receives at once."""
        known = [x for x in (self.send_bytes_per_s, self.receive_bytes_per_s) if x]
        return min(known) if known else None


class PeerProbeServer:
    """Answers probes on ``host``:``port`` (0 = an ephemeral port) until :meth:`close`.

    One connection at a time, on one thread: a probe is two nodes' business, and a
    second at once would halve both figures."""

    def __init__(
        self,
        token: bytes,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        max_bytes: int = 4 * PROBE_BYTES,
        timeout_s: float = 10.0,
    ) -> None:
        if len(token) != TOKEN_BYTES:
            raise ValueError(f"a probe token is {TOKEN_BYTES} bytes, got {len(token)}")
        self._token = token
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._sock = socket.create_server((host, port))
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="peer-probe", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=self._timeout_s)

    def __enter__(self) -> PeerProbeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(self._timeout_s)
                with contextlib.suppress(OSError, ConnectionError):
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + min(TOKEN_DEADLINE_S, self._timeout_s)
        token = _read_exactly(conn, TOKEN_BYTES, deadline)
        if not hmac.compare_digest(token, self._token):
            return
        conn.settimeout(self._timeout_s)
        while True:
            header = _read_exactly(conn, _REQUEST.size)
            if not header:
                return  # the peer is done
            op, n = _REQUEST.unpack(header)
            if n > self._max_bytes:
                return
            if op == _PING:
                conn.sendall(_PING)
            elif op == _UPLOAD:
                _discard(conn, n)
                conn.sendall(_UPLOAD)
            elif op == _DOWNLOAD:
                _send_zeros(conn, n)
            else:
                return


def measure_peer(
    peer: str,
    host: str,
    port: int,
    token: bytes,
    *,
    probe_bytes: int = PROBE_BYTES,
    pings: int = 5,
    timeout_s: float = 10.0,
) -> PeerLink:
    """The link to the :class:`PeerProbeServer` at ``host``:``port``, named ``peer``.

    Raises ``OSError`` when it cannot be reached or stops answering."""
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(token)
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            conn.sendall(_REQUEST.pack(_PING, 0))
            _expect(conn, _PING)
            rtts.append(time.perf_counter() - t0)
        rtt = statistics.median(rtts)
        send = receive = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            conn.sendall(_REQUEST.pack(_UPLOAD, probe_bytes))
            _send_zeros(conn, probe_bytes)
            _expect(conn, _UPLOAD)
            send = min(send, time.perf_counter() - t0)
            t0 = time.perf_counter()
            conn.sendall(_REQUEST.pack(_DOWNLOAD, probe_bytes))
            _discard(conn, probe_bytes)
            receive = min(receive, time.perf_counter() - t0)
    return PeerLink(peer, rtt, _rate(probe_bytes, send - rtt), _rate(probe_bytes, receive - rtt))


def _rate(n: int, seconds: float) -> float | None:
    return n / seconds if seconds > 0 else None


def _expect(conn: socket.socket, reply: bytes) -> None:
    if _read_exactly(conn, len(reply)) != reply:
        raise ConnectionError("the peer's probe server closed the connection")


def _read_exactly(conn: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes, or fewer only where the peer closed (b"" at once: a clean end) or,
    given a ``deadline`` (monotonic s), where it passed; without one each read waits
    for the connection's timeout."""
    parts, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            conn.settimeout(left)
        try:
            part = conn.recv(n - got)
        except TimeoutError:
            if deadline is None:
                raise
            break
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _discard(conn: socket.socket, n: int) -> None:
    buf = bytearray(_CHUNK)
    while n > 0:
        got = conn.recv_into(buf, min(n, _CHUNK))
        if not got:
            raise ConnectionError("the peer closed the connection mid-transfer")
        n -= got


def _send_zeros(conn: socket.socket, n: int) -> None:
    chunk = bytes(_CHUNK)
    while n > 0:
        conn.sendall(chunk[: min(n, _CHUNK)])
        n -= min(n, _CHUNK)
