"""``hetero-bench load``'s server-side figures: the coordinator's histogram, as its
``/metrics`` writes it, subtracted between two reads and its quantiles interpolated in
the buckets as PromQL's ``histogram_quantile`` does."""

from __future__ import annotations

import math
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from hetero.bench import loadserver
from hetero.bench.loadconfig import LoadError
from hetero.bench.loadserver import between, figures, parse, quantile
from hetero.coordinator.metrics import BUCKETS_S, RpcLatency


def _latency() -> tuple[RpcLatency, CollectorRegistry]:
    registry = CollectorRegistry()
    return RpcLatency(registry), registry


def _read(registry: CollectorRegistry) -> dict[tuple[str, str], dict[float, float]]:
    return parse(generate_latest(registry).decode())


def test_a_quantile_is_interpolated_inside_its_bucket() -> None:
    in_one = {0.005: 0.0, 0.0075: 100.0, math.inf: 100.0}
    assert math.isclose(quantile(in_one, 0.50), 0.00625)
    assert math.isclose(quantile(in_one, 0.99), 0.005 + 0.0025 * 0.99)
    assert math.isclose(quantile({0.001: 10.0, math.inf: 10.0}, 0.5), 0.0005), "from 0"
    assert quantile({10.0: 0.0, math.inf: 5.0}, 0.99) == 10.0, "+Inf: the highest bound"
    assert math.isnan(quantile({0.001: 0.0, math.inf: 0.0}, 0.5))
    assert math.isnan(quantile({}, 0.5))


def test_the_window_holds_the_calls_between_two_reads_by_status() -> None:
    latency, registry = _latency()
    for seconds in (0.0004, 0.004, 0.04):
        latency.observe("Heartbeat", "OK", seconds)
    first = _read(registry)
    for _ in range(10):
        latency.observe("Heartbeat", "OK", 0.012)
    latency.observe("Heartbeat", "NOT_FOUND", 0.001)
    latency.observe("GetPlan", "OK", 0.2)
    window = between(first, _read(registry))
    beats = figures(window, "Heartbeat")
    assert beats["server_calls"] == 10 and beats["server_errors"] == 1
    # All ten in (10 ms, 15 ms]: the p50 halfway, the p99 near the top.
    assert math.isclose(beats["server_p50_ms"], 12.5)
    assert math.isclose(beats["server_p99_ms"], 10 + 5 * 0.99)
    plans = figures(window, "GetPlan")
    assert plans["server_calls"] == 1 and 150 < plans["server_p50_ms"] <= 200
    none = figures(window, "ReportIntervalStats")
    assert none["server_calls"] == 0 and math.isnan(none["server_p99_ms"])


@given(
    st.lists(st.floats(min_value=1e-5, max_value=20.0), min_size=1, max_size=300),
    st.sampled_from([0.5, 0.9, 0.99]),
)
def test_the_interpolated_quantile_lies_in_the_bucket_of_the_exact_one(
    latencies: list[float], q: float
) -> None:
    latency, registry = _latency()
    for seconds in latencies:
        latency.observe("Heartbeat", "OK", seconds)
    estimate = quantile(_read(registry)[("Heartbeat", "OK")], q)
    exact = sorted(latencies)[math.ceil(q * len(latencies)) - 1]  # nearest rank
    bounds = (0.0, *BUCKETS_S, math.inf)
    upper = next(i for i, b in enumerate(bounds) if exact <= b)
    if math.isinf(bounds[upper]):
        assert estimate == BUCKETS_S[-1]
    else:
        assert bounds[upper - 1] <= estimate <= bounds[upper]


def test_a_coordinator_that_does_not_answer_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(loadserver, "READ_TIMEOUT_S", 0.3)
    with pytest.raises(LoadError, match=r"^cannot read the coordinator's /metrics at ") as err:
        loadserver.read(port)
    assert "\n" not in str(err.value)
