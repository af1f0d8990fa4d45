"""Round trip and bandwidth from this node to the coordinator, over the real gRPC channel."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

#: Bytes of the bandwidth probe's reply: large enough to dominate the round trip on a LAN.
PROBE_BYTES = 2 * 1024 * 1024

#: Options of the agent's channel to the coordinator. gRPC's own reconnect backoff
#: grows to 120 s and, while it waits, fails every call at once without trying:
#: after an outage of a few seconds an agent could stay deaf to a restarted
#: coordinator past the heartbeat timeout and be called down. Capped at 1 s, the
#: agent's own ``Backoff`` decides how often it tries.
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


@dataclass(frozen=True)
class NetworkMeasure:
    rtt_s: float
    bytes_per_s: float | None


def measure_network(
    stub: pb_grpc.CoordinatorStub, *, probes: int = 5, timeout_s: float = 5.0
) -> NetworkMeasure:
    """Median round trip of empty probes; bandwidth from a ``PROBE_BYTES`` reply.

    Raises ``grpc.RpcError`` if the coordinator cannot be reached.
    """
    rtts = []
    for _ in range(probes):
        t0 = time.perf_counter()
        stub.Probe(pb.ProbeRequest(), timeout=timeout_s)
        rtts.append(time.perf_counter() - t0)
    rtt = statistics.median(rtts)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        stub.Probe(pb.ProbeRequest(reply_bytes=PROBE_BYTES), timeout=timeout_s)
        best = min(best, time.perf_counter() - t0)
    transfer_s = best - rtt
    return NetworkMeasure(rtt, PROBE_BYTES / transfer_s if transfer_s > 0 else None)
