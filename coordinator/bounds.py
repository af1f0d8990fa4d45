"""What any request to the coordinator may carry: finite, plausible numbers, printable names.

Protobuf guarantees types, not sense. A node's credential registered a device of
``compute_score`` 1e308, ``cpu_count`` -4 and RAM -1, sent ``cpu_percent`` 1e308 and an
interval ``end_step`` of 2^63-1 (stuck for good as its job's last step, and past a
PostgreSQL INTEGER column), NaN and inf in fields no handler looked at, and device
names, an address and a CPU model holding escape sequences that reached operators'
terminals and ``/metrics`` labels. So before its handler, every request is walked
whole (:func:`check`), wherever each message type appears in it:

- every float and double is finite, but a rank's ``loss_sum``: a diverged loss is
  a measurement, kept as "not reported" (:func:`clear_diverged`);
- every number of :data:`NUMBERS` lies in its range, bounds included (what no
  hardware or run measures is a forgery or a bug);
- every enum is one of its values;
- every string of :data:`NAMES` is one printable line (no control character, no
  bidirectional override, no tab) of at most its length: names are shown to
  operators and exported as labels;
- no string holds NUL, which PostgreSQL's text refuses (a rank's log line may: it
  is stored with U+FFFD, ``logwire``).

A refusal is INVALID_ARGUMENT, one line naming the call, the field's path and the
value. Every number and string field of every request is in :data:`NUMBERS`,
:data:`NAMES` or :data:`FREE` (a test checks it), so a field added to the protocol
is bounded or said to be free, never forgotten. What a value means for the state
(a rank of the job, a node's own name) is checked by the handlers (``validate``,
``reports``, ``scope``).
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from hetero.core.errors import ConfigError
from hetero.v1 import types_pb2 as tpb

#: Largest value of a 32-bit column (PostgreSQL's INTEGER), and of a 64-bit one.
INT32 = 2**31 - 1
INT64 = 2**63 - 1
#: Bytes no device or host holds (1 PiB), and bytes per second no link moves (100 TB/s).
BYTES = 2**50
BYTES_PER_S = 1e14
#: Seconds no interval, probe or round trip lasts (ten days), and no Unix time reaches
#: (the year 5138).
SECONDS = 864_000.0
UNIX_S = 1e11
#: Ranks of one job, and devices of one node (indexes).
RANKS = 2**20
DEVICE_INDEXES = 4095
#: Longest id (a job's or node's: 12 hex digits today), and longest name, in characters
#: (255: the name columns' length, which PostgreSQL enforces; SQLite stores any).
ID_CHARS = 64
NAME_CHARS = 255

#: Ranges of number fields, inclusive, by ``Message.field`` (the message's short name).
NUMBERS: dict[str, tuple[float, float]] = {
    # RegisterNode: a device's profile; compute_score is its matmul TFLOP/s.
    "DeviceProfile.index": (0, DEVICE_INDEXES),
    "DeviceProfile.matmul_tflops": (0, 1e5),
    "DeviceProfile.memory_bandwidth_bytes_per_s": (0, BYTES_PER_S),
    "DeviceProfile.host_to_device_bytes_per_s": (0, BYTES_PER_S),
    "DeviceProfile.device_to_host_bytes_per_s": (0, BYTES_PER_S),
    "DeviceProfile.memory_bytes": (0, BYTES),
    "DeviceProfile.compute_score": (0, 1e5),
    "DeviceProfile.emulated_slowdown": (0, 100),
    "DeviceProfile.foreign_utilization_percent": (0, 100),
    "HostProfile.cpu_count": (0, 65536),
    "HostProfile.cpu_gflops": (0, 1e7),
    "HostProfile.ram_bytes": (0, BYTES),
    "HostProfile.network_rtt_s": (0, SECONDS),
    "HostProfile.network_bytes_per_s": (0, BYTES_PER_S),
    "HostProfile.emulated_slowdown": (0, 100),
    "HostProfile.measured_in_s": (0, SECONDS),
    "HostProfile.disk_read_bytes_per_s": (0, BYTES_PER_S),
    "PeerLink.rtt_s": (0, SECONDS),
    "PeerLink.send_bytes_per_s": (0, BYTES_PER_S),
    "PeerLink.receive_bytes_per_s": (0, BYTES_PER_S),
    "PeerLink.measured_at_unix_s": (0, UNIX_S),
    "WatchOrdersRequest.peer_probe_port": (0, 65535),
    # Heartbeat: telemetry.
    "HostTelemetry.cpu_percent": (0, 100),
    "HostTelemetry.ram_used_bytes": (0, BYTES),
    "HostTelemetry.ram_total_bytes": (0, BYTES),
    "DeviceTelemetry.device_index": (0, DEVICE_INDEXES),
    "DeviceTelemetry.utilization_percent": (0, 100),
    "DeviceTelemetry.memory_used_bytes": (0, BYTES),
    "DeviceTelemetry.memory_total_bytes": (0, BYTES),
    "DeviceTelemetry.temperature_c": (-60, 250),
    "DeviceTelemetry.power_w": (0, 1e5),
    "DeviceTelemetry.sm_clock_mhz": (0, 1e5),
    "HeartbeatRequest.sampled_at_unix_s": (0, UNIX_S),
    # Ranks' states and lines.
    "ReportRankStatusRequest.rank": (0, RANKS),
    "ReportRankStatusRequest.attempt": (0, INT32),
    "LogLine.rank": (0, RANKS),
    "LogLine.time_unix_s": (0, UNIX_S),
    # Interval statistics: steps and versions are 32-bit columns.
    "IntervalReport.end_step": (0, INT32),
    "IntervalReport.plan_version": (0, INT32),
    "IntervalReport.received_at_unix_s": (0, UNIX_S),
    "RankIntervalStats.rank": (0, RANKS),
    "RankIntervalStats.batch": (0, INT32),
    "RankIntervalStats.steps": (0, INT32),
    "RankIntervalStats.compute_s": (0, SECONDS),
    "RankIntervalStats.step_s": (0, SECONDS),
    "RankIntervalStats.peak_memory_bytes": (0, BYTES),
    "RankIntervalStats.data_s": (0, SECONDS),
    "RankIntervalStats.comm_wait_s": (0, SECONDS),
    "RankIntervalStats.forward_s": (0, SECONDS),
    "RankIntervalStats.backward_s": (0, SECONDS),
    "RankIntervalStats.optimizer_s": (0, SECONDS),
    "RankIntervalStats.samples": (0, INT64),
    "RankIntervalStats.switch_s": (0, SECONDS),
    "RankIntervalStats.busy_cv": (0, 1e3),
    "RankIntervalStats.input_s": (0, SECONDS),
    "RankIntervalStats.input_cv": (0, 1e3),
    # A job its own launcher started.
    "AttachJobRequest.global_batch": (0, INT32),
    "AttachJobRequest.steps": (0, INT32),
    "AttachJobRequest.rebalance_interval": (0, INT32),
    "AttachJobRequest.min_batch": (0, INT32),
    "AttachedRank.compute_score": (0, 1e5),
    "AttachedRank.emulated_slowdown": (0, 100),
    # Reads.
    "ProbeRequest.reply_bytes": (0, 4 * 1024 * 1024),
    "ListJobsRequest.limit": (0, INT32),
    "GetJobLogsRequest.after_seq": (0, INT64),
    "GetJobLogsRequest.limit": (0, INT32),
    "GetJobDetailRequest.max_intervals": (0, INT32),
    "GetJobDetailRequest.after_step": (-1, INT64),
    "WatchClusterRequest.period_s": (0, 3600),
}

#: Strings that name or identify something: one printable line of at most this many
#: characters ("" passes here; a handler says when one is required).
NAMES: dict[str, int] = {
    "RegisterNodeRequest.name": NAME_CHARS,
    "RegisterNodeRequest.address": NAME_CHARS,
    "RegisterNodeRequest.agent_endpoint": NAME_CHARS,
    "RegisterNodeRequest.agent_version": 64,
    "DeviceProfile.name": NAME_CHARS,
    "DeviceProfile.suspect": 64,
    "HostProfile.cpu_model": NAME_CHARS,
    "HostProfile.disk_read_method": 16,
    "PeerLink.peer": NAME_CHARS,
    "HeartbeatRequest.node_id": ID_CHARS,
    "ThrottleReasons.reasons": 64,
    "WatchOrdersRequest.node_id": ID_CHARS,
    "ReportPeerLinksRequest.node_id": ID_CHARS,
    "ReportRankStatusRequest.node_id": ID_CHARS,
    "ReportRankStatusRequest.job_id": ID_CHARS,
    "AppendJobLogsRequest.job_id": ID_CHARS,
    "LogLine.stream": 8,
    "IntervalReport.job_id": ID_CHARS,
    "GetPlanRequest.job_id": ID_CHARS,
    "AttachJobRequest.name": NAME_CHARS,
    "AttachJobRequest.launcher": NAME_CHARS,
    "AttachJobRequest.launcher_job_id": NAME_CHARS,
    "AttachJobRequest.policy": 32,
    "AttachedRank.host": NAME_CHARS,
    "AttachedRank.device_name": NAME_CHARS,
    "DetachJobRequest.job_id": ID_CHARS,
    "ListJobsRequest.page_token": NAME_CHARS,
    "GetJobRequest.job_id": ID_CHARS,
    "CancelJobRequest.job_id": ID_CHARS,
    "GetJobLogsRequest.job_id": ID_CHARS,
    "DrainNodeRequest.node": NAME_CHARS,
    "GetJobDetailRequest.job_id": ID_CHARS,
}

#: Fields bounded elsewhere or not at all, and why.
FREE: dict[str, str] = {
    "ReportRankStatusRequest.exit_code": "any exit status (a signal's is negative)",
    "ReportRankStatusRequest.message": "text shown escaped, cut at 1,024 characters; no NUL",
    "LogLine.seq": "ignored on append",
    "LogLine.text": "a rank's output, cut at 4,096 characters and weighed by the log caps",
    "RankIntervalStats.loss_sum": "any finite loss; a diverged one is cleared",
    "DetachJobRequest.message": "text shown escaped, cut at 1,024 characters; no NUL",
    "SubmitJobRequest.spec_yaml": "bounded by max_spec_bytes and parsed by the spec's rules",
    "SubmitJobRequest.source_name": "made one short line (api.source_name)",
    "SubmitJobRequest.priority": "checked against the queue's priorities (jobspec)",
    "ProbeRequest.payload": "bytes, bounded by max_message_bytes",
    "WatchOrdersRequest.peer_probe_token": "a probe's token: its length checked by the handler, "
    "never shown, logged or stored (peerlinks)",
}

#: Floats that may be NaN or infinite: cleared, not refused (:func:`clear_diverged`).
_MAY_DIVERGE = frozenset({"RankIntervalStats.loss_sum"})

_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def check(method: str, request: Message) -> None:
    """``ConfigError`` (INVALID_ARGUMENT) for the first value of ``request`` out of its
    bounds (module doc), naming ``method`` and the field's path."""
    _walk(request, method, "")


def _walk(msg: Message, method: str, path: str) -> None:
    kind = msg.DESCRIPTOR.name
    for f, value in msg.ListFields():
        key = f"{kind}.{f.name}"
        where = f"{path}{f.name}"
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            items = value if f.is_repeated else (value,)
            for i, item in enumerate(items):
                _walk(item, method, f"{where}[{i}]." if f.is_repeated else f"{where}.")
            continue
        for i, v in enumerate(value if f.is_repeated else (value,)):
            _value(method, f"{where}[{i}]" if f.is_repeated else where, key, f, v)


def _value(method: str, where: str, key: str, f: FieldDescriptor, v: Any) -> None:
    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{method}: {where}: {why}")

    if f.type in _FLOATS and not math.isfinite(v) and key not in _MAY_DIVERGE:
        raise refuse(f"must be a finite number, got {v}")
    bounds = NUMBERS.get(key)
    if bounds is not None and not bounds[0] <= v <= bounds[1]:
        raise refuse(f"must be in [{_num(bounds[0])}, {_num(bounds[1])}], got {_num(v)}")
    if f.type == FieldDescriptor.TYPE_ENUM and f.enum_type.values_by_number.get(v) is None:
        raise refuse(f"unknown value {v}")
    if f.type != FieldDescriptor.TYPE_STRING:
        return
    most = NAMES.get(key)
    if most is not None and (len(v) > most or not v.isprintable()):
        raise refuse(f"must be one printable line of at most {most} characters, got {_shown(v)}")
    if "\x00" in v and key != "LogLine.text":
        raise refuse("must not hold NUL")


def _num(v: float) -> str:
    """A bound or a value as written: whole numbers in full (2147483647, not 2.14748e+09)."""
    if isinstance(v, int) or (v.is_integer() and abs(v) < 1e16):
        return str(int(v))
    return f"{v:g}"


def _shown(text: str) -> str:
    """The start of a refused string, escaped (it is in an error a terminal shows)."""
    return ascii(text[:40]) + ("..." if len(text) > 40 else "")


def clear_diverged(report: tpb.IntervalReport) -> None:
    """A rank's ``loss_sum`` that is NaN or infinite (the run diverged) becomes "not
    reported": the balancer does not read it, and stored it would be NULL on SQLite
    and NaN on PostgreSQL."""
    for r in report.ranks:
        if r.HasField("loss_sum") and not math.isfinite(r.loss_sum):
            r.ClearField("loss_sum")
