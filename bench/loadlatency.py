"""Latency figures of ``hetero-bench load`` beyond the percentiles: a histogram per method
(what a published figure is checked against; the raw latencies stay in each
generator's ``result.json``), and the heartbeat latency with and without
``/metrics`` scrapers, split by the scrape phases the calls started in.
"""

from __future__ import annotations

import math
from typing import Any

from hetero.bench.loadscrape import busy

#: Histogram buckets per decade: bucket edges 10^(k/40) ms, each 6% wider than the last,
#: finer than any difference a p99 here is read for.
BUCKETS_PER_DECADE = 40


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``sorted_values``; NaN if empty."""
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def histogram(latencies_s: list[float]) -> dict[str, Any]:
    """Counts of ``latencies_s`` per log-spaced bucket: ``{"upper_ms": [...], "counts":
    [...]}`` for the non-empty buckets, each bucket holding values <= its upper edge and
    above the one before it (a bucket's upper edge is 10^(k/BUCKETS_PER_DECADE) ms)."""
    counts: dict[int, int] = {}
    for v in latencies_s:
        ms = max(v * 1e3, 1e-3)
        k = math.ceil(math.log10(ms) * BUCKETS_PER_DECADE - 1e-9)
        counts[k] = counts.get(k, 0) + 1
    keys = sorted(counts)
    return {
        "buckets_per_decade": BUCKETS_PER_DECADE,
        "upper_ms": [round(10 ** (k / BUCKETS_PER_DECADE), 4) for k in keys],
        "counts": [counts[k] for k in keys],
    }


def by_scrape_phase(
    latencies_s: list[float], starts_s: list[float], phase_s: float
) -> dict[str, dict[str, float]]:
    """p50/p99 (ms) and call counts of the calls started in quiet phases and in scrape
    phases (``loadscrape.busy``; ``starts_s`` are seconds after the window's start)."""
    quiet: list[float] = []
    scraped: list[float] = []
    for latency, start in zip(latencies_s, starts_s, strict=True):
        (scraped if busy(start, 0.0, phase_s) else quiet).append(latency)
    out = {}
    for name, values in (("without_scrapers", quiet), ("with_scrapers", scraped)):
        values.sort()
        out[name] = {
            "calls": len(values),
            "p50_ms": percentile(values, 0.50) * 1e3,
            "p99_ms": percentile(values, 0.99) * 1e3,
        }
    return out
