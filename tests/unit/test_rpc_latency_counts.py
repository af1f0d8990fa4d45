"""The coordinator's RPC latency counts (``rpclatency``) write the exposition
prometheus-client's own ``Histogram`` writes for the same calls: buckets by ``le``
(a call of exactly a bound's seconds in that bound's), ``_count``, ``_sum`` and
``_created``, in the order the pairs were first seen."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from hetero.coordinator.metrics import write
from hetero.coordinator.rpclatency import BUCKETS_S, HELP, NAME, RpcLatency, families

CALLS = st.lists(
    st.tuples(
        st.sampled_from(["Heartbeat", "GetPlan", "ReportIntervalStats"]),
        st.sampled_from(["OK", "NOT_FOUND"]),
        st.one_of(st.sampled_from([0.0, *BUCKETS_S, 11.0]), st.floats(0.0, 20.0)),
    ),
    max_size=200,
)


def _without_created(text: bytes) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text.decode())


@given(CALLS)
def test_the_text_is_prometheus_clients_own(calls: list[tuple[str, str, float]]) -> None:
    registry = CollectorRegistry(auto_describe=True)
    theirs = Histogram(NAME, HELP, ("method", "code"), buckets=BUCKETS_S, registry=registry)
    ours = RpcLatency()
    for method, code, seconds in calls:
        theirs.labels(method, code).observe(seconds)
        ours.observe(method, code, seconds)
    expected = _without_created(write(list(registry.collect())))
    assert _without_created(write(families(ours.counts()))) == expected
    assert _without_created(write(list(ours.registry.collect()))) == expected


def test_counts_are_a_copy_and_created_is_when_a_pair_was_first_seen() -> None:
    latency = RpcLatency()
    latency.observe("Heartbeat", "OK", 0.001)
    copy = latency.counts()
    for _ in range(3):
        latency.observe("Heartbeat", "OK", 0.001)
    assert sum(copy["Heartbeat", "OK"].buckets) == 1
    assert latency.counts()["Heartbeat", "OK"].created == copy["Heartbeat", "OK"].created
