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
counts (tests run many in one process).

Counted here, written elsewhere: ``observe`` adds one to a bucket of plain
lists, and ``counts`` copies them (about 20 µs for two dozen method and status
pairs); ``families`` makes prometheus-client's families of a copy, which the
``/metrics`` process writes as text. prometheus-client's own ``Histogram``
kept them in the coordinator's process, and collecting and writing it took
6.5 ms there (two dozen pairs, a 2-core box): under a scrape storm, every
quarter second a pause of the interpreter the event loop answering heartbeats
needs. The exposition is the same, ``_created`` included.

Cost: ``RpcLatency.observe`` takes about 0.5 µs (a binary search of the
bounds, one lock, two additions).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

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


HELP = (
    "Seconds the coordinator took to answer a call, from its handler's start to its reply or abort."
)


@dataclass
class Counts:
    """One ``(method, code)`` pair's calls: per bucket of :data:`BUCKETS_S` and one
    beyond (not cumulative), their seconds' sum, and when the pair was first seen."""

    buckets: list[int]
    sum_s: float
    created: float


#: What ``RpcLatency.counts`` copies: picklable, for the ``/metrics`` process.
LatencyCounts = dict[tuple[str, str], Counts]


class RpcLatency:
    """The histogram of one coordinator: its counts, and ``registry`` to read them as
    prometheus-client would (``get_sample_value``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: LatencyCounts = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))

    def observe(self, method: str, code: str, seconds: float) -> None:
        """Count one call of ``method`` that ended with status ``code`` after ``seconds``."""
        at = bisect.bisect_left(BUCKETS_S, seconds)  # the first bound >= seconds, as ``le``
        with self._lock:
            counts = self._counts.get((method, code))
            if counts is None:
                counts = self._counts[(method, code)] = Counts(
                    [0] * (len(BUCKETS_S) + 1), 0.0, time.time()
                )
            counts.buckets[at] += 1
            counts.sum_s += seconds

    def counts(self) -> LatencyCounts:
        """A copy of every pair's counts."""
        with self._lock:
            return {
                pair: Counts(list(c.buckets), c.sum_s, c.created)
                for pair, c in self._counts.items()
            }


def families(counts: LatencyCounts) -> list[Metric]:
    """The histogram family of ``counts``, as prometheus-client's ``Histogram`` has it."""
    family = HistogramMetricFamily(NAME, HELP, labels=("method", "code"))
    bounds = [*(floatToGoString(b) for b in BUCKETS_S), "+Inf"]  # type: ignore[no-untyped-call]
    for (method, code), c in counts.items():  # in the order first seen
        total, cumulative = 0, []
        for bound, n in zip(bounds, c.buckets, strict=True):
            total += n
            cumulative.append((bound, float(total)))
        family.add_metric((method, code), cumulative, c.sum_s)
        family.add_sample(NAME + "_created", {"method": method, "code": code}, c.created)
    return [family]


class _Collector(Collector):
    def __init__(self, latency: RpcLatency) -> None:
        self._latency = latency

    def collect(self) -> Iterator[Metric]:
        return iter(families(self._latency.counts()))
