"""How long the coordinator takes to answer each RPC, as its own ``/metrics`` says:
``hetero_rpc_duration_seconds``, a histogram by ``method`` and ``code``.

A unary call of the Coordinator service (not the ``WatchCluster`` stream) is timed
from the start of its handler's coroutine to its return or abort
(``asyncserver.AsyncCoordinator``): the checks of who calls, then either the answer
from memory on the event loop or the wait for a database thread and the work there
(for an interval report, the report worker's). What happens before the handler
starts (reading and decoding the request, the token check, the queue of a loop
busy with other calls) and after it returns (encoding and sending the reply) is
not in it: that is the client's share of its own latency figure, with the
network and the client's scheduling. A call refused before its handler runs (a
bad token, ``concurrent_rpcs`` exceeded) is not counted.

``code`` is the gRPC status code's name (``OK``, ``NOT_FOUND``, ...): a fast
refusal would otherwise pull an ``OK`` p99 down. Each coordinator has its own
registry (tests run many in one process); ``metricsserver`` writes it after the
cluster snapshot's families, cached apart from them.

Cost: ``RpcLatency.observe`` takes 0.87 to 1.08 µs (fast calls to slow ones: the
buckets are searched in order), about 1 µs a call with the clock reads around it
(``timeit`` on a 2-core x86_64 VM, Python 3.11, prometheus-client 0.26): 1.3 ms of
CPU a second at 1,300 calls a second.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

NAME = "hetero_rpc_duration_seconds"
#: Upper bounds, seconds: fine enough to read a p99 anywhere between 1 ms and a few
#: seconds (neighbours at most 2x apart; about 1.5x between 5 ms and 1 s), and to
#: tell the answers from memory (0.1 to 0.5 ms) from the rest.
BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
    10.0,
)
#: The sample names the histogram writes (what ``?name[]=`` of a scrape selects).
SAMPLE_NAMES = frozenset(NAME + suffix for suffix in ("_bucket", "_count", "_sum", "_created"))


class RpcLatency:
    """The histogram of one coordinator, in a registry of its own (``registry``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._histogram = Histogram(
            NAME,
            "Seconds the coordinator took to answer a call, from its handler's start to its "
            "reply or abort.",
            ("method", "code"),
            buckets=BUCKETS_S,
            registry=self.registry,
        )
        # ``labels`` takes a lock and builds a key each time (1.8 µs against 0.8 µs for
        # the child's own observe); the calls ask for the same few pairs. Two threads
        # adding the same pair get the same child from ``labels``.
        self._children: dict[tuple[str, str], Histogram] = {}

    def observe(self, method: str, code: str, seconds: float) -> None:
        """Count one call of ``method`` that ended with status ``code`` after ``seconds``."""
        child = self._children.get((method, code))
        if child is None:
            child = self._children[(method, code)] = self._histogram.labels(method, code)
        child.observe(seconds)
