"""Checks of agents' requests beyond their shape: values the store and the balancer can use.

Protobuf guarantees types, not sense: a double may be NaN (stored as NULL,
breaking NOT NULL columns), an int64 may be negative, an enum may carry a
number the schema lacks. Each check raises ``ConfigError`` (INVALID_ARGUMENT)
naming the field, before the handler opens a transaction.
"""

from __future__ import annotations

import math

from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

#: Longest node name, address, endpoint or device name, in characters.
MAX_NAME_CHARS = 255
#: Longest agent version, in characters. Both are the columns' lengths, which
#: PostgreSQL enforces (SQLite stores any length).
MAX_VERSION_CHARS = 64
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


def _finite_non_negative(msg: object, field: str, where: str) -> None:
    value = getattr(msg, field)
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{where}: {field} must be a finite number >= 0, got {value}")


def register_node(req: pb.RegisterNodeRequest) -> None:
    """A registration the store and placement can take as it is."""
    for field in ("name", "address", "agent_endpoint", "agent_version"):
        value = getattr(req, field)
        most = MAX_VERSION_CHARS if field == "agent_version" else MAX_NAME_CHARS
        if len(value) > most or any(c in value for c in "\x00\n\r"):
            raise ConfigError(
                f"RegisterNode: {field} must be one line of at most {most} characters"
            )
    if len(req.devices) > MAX_DEVICES:
        raise ConfigError(f"RegisterNode: {len(req.devices)} devices, limit {MAX_DEVICES}")
    for d in req.devices:
        where = f"node {req.name} device {d.index}"
        if d.index < 0:
            raise ConfigError(f"{where}: index must be >= 0")
        if len(d.name) > MAX_NAME_CHARS:
            raise ConfigError(f"{where}: name must be at most {MAX_NAME_CHARS} characters")
        if d.kind not in tpb.DeviceKind.values():
            raise ConfigError(f"{where}: kind: unknown value {d.kind}")
        for field in _OPTIONAL_RATES:
            if d.HasField(field):
                _finite_non_negative(d, field, where)
        if d.HasField("memory_bytes") and d.memory_bytes < 0:
            raise ConfigError(f"{where}: memory_bytes must be >= 0, got {d.memory_bytes}")
        if len(d.suspect) > len(_OPTIONAL_RATES) or not set(d.suspect) <= set(_OPTIONAL_RATES):
            raise ConfigError(f"{where}: suspect must name fields of {_OPTIONAL_RATES}")
        if d.HasField("foreign_utilization_percent"):
            u = d.foreign_utilization_percent
            if not (math.isfinite(u) and 0.0 <= u <= 100.0):
                raise ConfigError(f"{where}: foreign_utilization_percent must be in [0, 100]")
        slowdown = d.emulated_slowdown
        if slowdown != 0.0 and not 1.0 <= slowdown <= MAX_EMULATED_SLOWDOWN:
            raise ConfigError(
                f"{where}: emulated_slowdown must be in [1, {MAX_EMULATED_SLOWDOWN:g}] "
                f"(or unset), got {slowdown}"
            )
    if req.HasField("host"):
        h = req.host
        for field in (
            "cpu_gflops",
            "network_rtt_s",
            "network_bytes_per_s",
            "disk_read_bytes_per_s",
        ):
            if h.HasField(field):
                _finite_non_negative(h, field, f"node {req.name} host")
        if h.disk_read_method not in DISK_READ_METHODS:
            raise ConfigError(
                f"node {req.name} host: disk_read_method must be one of {DISK_READ_METHODS}"
            )
        if len(h.peer_links) > MAX_PEER_LINKS:
            raise ConfigError(f"node {req.name} host: at most {MAX_PEER_LINKS} peer_links")
        for link in h.peer_links:
            where = f"node {req.name} host link to {link.peer[:40]!r}"
            if not link.peer or len(link.peer) > 255 or not link.peer.isprintable():
                raise ConfigError(f"{where}: peer must be a printable node id")
            _finite_non_negative(link, "rtt_s", where)
            for field in ("send_bytes_per_s", "receive_bytes_per_s"):
                if link.HasField(field):
                    _finite_non_negative(link, field, where)
        for field in ("emulated_slowdown", "measured_in_s"):
            _finite_non_negative(h, field, f"node {req.name} host")
