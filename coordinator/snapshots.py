"""The cluster snapshot every ``/metrics`` scrape shares: built again at most once per
``ttl_s`` and at most ``share`` of the time (one builder at a time; the others wait for
it and share it). The coordinator builds it from memory on its event loop
(``server.CoordinatorServer.snapshot``); the ``/metrics`` process writes its text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hetero.v1 import coordinator_pb2 as pb

#: Seconds a snapshot is served before it is built again, at least.
TTL_S = 1.0
#: Most of the time builds may take: a build that took B seconds is served for at least
#: B / SHARE.
SHARE = 0.1


class Snapshots:
    """The snapshot ``build()`` returns (serialized), built again at most once per
    ``ttl_s`` and at most ``share`` of the time (a build that took B seconds is served
    for at least B / ``share``). ``builds`` counts them."""

    def __init__(
        self,
        build: Callable[[], bytes],
        ttl_s: float = TTL_S,
        share: float = SHARE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = build
        self.ttl_s = ttl_s
        self._share = share
        self._clock = clock
        self._lock = threading.Lock()
        self._data = b""
        self._parsed: tuple[int, pb.ClusterSnapshot] | None = None
        self._built_at = -float("inf")
        self._build_s = 0.0
        self.builds = 0

    @classmethod
    def of(cls, snapshot: Callable[[], pb.ClusterSnapshot], ttl_s: float = TTL_S) -> Snapshots:
        """Snapshots of a function that builds the message itself (tests, tools)."""
        return cls(lambda: snapshot().SerializeToString(), ttl_s)

    def latest(self) -> tuple[int, bytes]:
        """The current snapshot, serialized, and its build's number (1 = the first)."""
        with self._lock:  # one builder; concurrent readers wait for it, then share it
            if self._clock() - self._built_at >= max(self.ttl_s, self._build_s / self._share):
                started = self._clock()
                self._data = self._build()
                self._built_at = self._clock()
                self._build_s = self._built_at - started
                self.builds += 1
            return self.builds, self._data

    def message(self) -> pb.ClusterSnapshot:
        """The current snapshot as a message (parsed once per build)."""
        number, data = self.latest()
        with self._lock:
            if self._parsed is None or self._parsed[0] != number:
                self._parsed = (number, pb.ClusterSnapshot.FromString(data))
            return self._parsed[1]
