"""The coordinator's own latency in ``hetero-bench load``: its ``/metrics`` histogram
``hetero_rpc_duration_seconds`` (``coordinator.metrics``) read at the window's start
and end, subtracted, and its p50/p99 interpolated in the buckets.

Beside the generators' latencies (the client's: the coordinator's handling plus the
network, the generators' own event loops and whatever the shared cores made every
process wait), this is the coordinator's handling alone: from its handler's start to
its reply, or its abort. The window differs slightly from the generators': here the
calls the coordinator finished between the two reads, there the calls the generators
started between the window's edges and saw answered; the calls in flight at either edge,
and the moments the reads were made, move a few calls from one count to the other.

The reads ask only for the histogram's buckets (``?name[]=``), which the coordinator
answers without reading its cluster snapshot, so reading them costs the window little.
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections.abc import Iterable

from hetero.bench.loadconfig import LoadError

NAME = "hetero_rpc_duration_seconds"
#: Seconds a read of ``/metrics`` may take, tries again included.
READ_TIMEOUT_S = 10.0
#: Seconds between tries.
RETRY_S = 0.05

#: Cumulative counts per upper bound (seconds; the last is +Inf), by (method, code).
Buckets = dict[tuple[str, str], dict[float, float]]


def read(port: int) -> Buckets:
    """The histogram's buckets from the coordinator's ``/metrics`` on loopback ``port``
    (loopback needs no token), tried again until it answers: ``--scrapers`` may hold
    every connection it serves, and it closes the ones beyond at once. A one-line
    ``LoadError`` if it has not answered within ``READ_TIMEOUT_S``."""
    url = f"http://127.0.0.1:{port}/metrics?name[]={NAME}_bucket"
    deadline = time.monotonic() + READ_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=max(left, 0.1)) as resp:
                return parse(resp.read().decode("utf-8"))
        except OSError as exc:
            if left <= RETRY_S:
                raise LoadError(f"cannot read the coordinator's /metrics at {url}: {exc}") from None
        time.sleep(RETRY_S)


def parse(text: str) -> Buckets:
    """The histogram's buckets in an exposition ``text``."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: Buckets = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{NAME}_bucket":
                key = (s.labels["method"], s.labels["code"])
                buckets.setdefault(key, {})[float(s.labels["le"])] = s.value
    return buckets


def between(first: Buckets, last: Buckets) -> Buckets:
    """The calls counted after ``first`` and by ``last`` (a series new in ``last``
    counts whole)."""
    return {
        key: {le: n - first.get(key, {}).get(le, 0.0) for le, n in counts.items()}
        for key, counts in last.items()
    }


def merged(series: Iterable[dict[float, float]]) -> dict[float, float]:
    """Several series' cumulative counts added bucket by bucket."""
    out: dict[float, float] = {}
    for counts in series:
        for le, n in counts.items():
            out[le] = out.get(le, 0.0) + n
    return out


def quantile(cumulative: dict[float, float], q: float) -> float:
    """The ``q`` quantile (0 < q < 1) in seconds, interpolated linearly inside the bucket
    that holds it as PromQL's ``histogram_quantile`` does (the first bucket starts at 0; a
    quantile in the +Inf bucket is the highest finite bound); NaN with no calls."""
    bounds = sorted(cumulative)
    total = cumulative.get(math.inf, 0.0)
    if total <= 0 or not bounds:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for upper in bounds:
        n = cumulative[upper]
        if n >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (n - below)
        lower, below = upper, n
    return lower


def figures(window: Buckets, method: str) -> dict[str, float]:
    """``method``'s calls in ``window``: those answered OK (the ones the generators time)
    with their bucket-interpolated p50 and p99 (ms), and those answered otherwise."""
    ok = merged(c for (m, code), c in window.items() if m == method and code == "OK")
    failed = sum(
        c.get(math.inf, 0.0) for (m, code), c in window.items() if m == method and code != "OK"
    )
    return {
        "server_calls": int(ok.get(math.inf, 0.0)),
        "server_errors": int(failed),
        "server_p50_ms": quantile(ok, 0.50) * 1e3,
        "server_p99_ms": quantile(ok, 0.99) * 1e3,
    }
