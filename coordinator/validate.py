"""Checks of a node's registration beyond each field's bounds (``bounds``: finite,
plausible, printable): what the store and placement need of the whole.

Each check raises ``ConfigError`` (INVALID_ARGUMENT) naming the field, before the
handler changes anything.
"""

from __future__ import annotations

from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2 as pb

#: Devices one node may register.
MAX_DEVICES = 1024
MAX_EMULATED_SLOWDOWN = 100.0
#: How an agent read its data disk (``agent.diskprobe``); "" when it did not.
DISK_READ_METHODS = ("", "o_direct", "fadvise", "cached")
#: Links to other nodes one registration may carry.
MAX_PEER_LINKS = 1024
_OPTIONAL_RATES = (
    "matmul_tflops",
    "memory_bandwidth_bytes_per_s",
    "host_to_device_bytes_per_s",
    "device_to_host_bytes_per_s",
)


def register_node(req: pb.RegisterNodeRequest) -> None:
    """A registration the store and placement can take as it is (its fields are within
    their ``bounds`` already)."""
    if not req.name or not req.address:
        raise ConfigError("RegisterNode needs name and address")
    indexes = [d.index for d in req.devices]
    if len(set(indexes)) != len(indexes):
        raise ConfigError(f"node {req.name}: duplicate device indexes {indexes}")
    if len(req.devices) > MAX_DEVICES:
        raise ConfigError(f"RegisterNode: {len(req.devices)} devices, limit {MAX_DEVICES}")
    for d in req.devices:
        where = f"node {req.name} device {d.index}"
        if d.compute_score <= 0:
            raise ConfigError(f"{where}: compute_score must be > 0")
        if len(d.suspect) > len(_OPTIONAL_RATES) or not set(d.suspect) <= set(_OPTIONAL_RATES):
            raise ConfigError(f"{where}: suspect must name fields of {_OPTIONAL_RATES}")
        slowdown = d.emulated_slowdown
        if slowdown != 0.0 and not 1.0 <= slowdown <= MAX_EMULATED_SLOWDOWN:
            raise ConfigError(
                f"{where}: emulated_slowdown must be in [1, {MAX_EMULATED_SLOWDOWN:g}] "
                f"(or unset), got {slowdown}"
            )
    if req.HasField("host"):
        h = req.host
        if h.disk_read_method not in DISK_READ_METHODS:
            raise ConfigError(
                f"node {req.name} host: disk_read_method must be one of {DISK_READ_METHODS}"
            )
        if len(h.peer_links) > MAX_PEER_LINKS:
            raise ConfigError(f"node {req.name} host: at most {MAX_PEER_LINKS} peer_links")
        for link in h.peer_links:
            if not link.peer:
                raise ConfigError(f"node {req.name} host: a peer link names no peer")
