"""Attack: a credential sends numbers no hardware measures and names that drive terminals
(issue #33).

A node's credential registered ``compute_score`` 1e308, ``cpu_count`` -4 and RAM -1, sent
``cpu_percent`` 1e308, an interval ``end_step`` of 2^63-1 (stuck for good as the job's
last step) and NaN and inf where no handler looked, and names, an address and a CPU
model holding escape sequences, which reached ``hetero-top`` and ``/metrics``. Every
request is now checked field by field before its handler (``coordinator.bounds``): each
bad value below is refused INVALID_ARGUMENT in one line naming the field, through a real
coordinator on port 0 (SQLite under tmp_path), and nothing of it is kept.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from conftest import Coordinator
from simcluster import DEADLINE_S
from sqlalchemy import text

from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

NAN, INF = math.nan, math.inf
#: OSC 52: sets the clipboard of the terminal that shows it (here to ``rm -rf ~``).
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"
JOB = (
    "name: steady\nmodel: debug\nglobal_batch: 8\nsteps: 100\nresources: {ranks: 1, device: cpu}\n"
)


def _device(**fields: Any) -> tpb.DeviceProfile:
    base: dict[str, Any] = {
        "index": 0,
        "name": "cpu",
        "kind": tpb.DEVICE_KIND_CPU,
        "compute_score": 1.0,
    }
    return tpb.DeviceProfile(**{**base, **fields})


def _register(device: tpb.DeviceProfile | None = None, **fields: Any) -> pb.RegisterNodeRequest:
    base: dict[str, Any] = {"name": "n1", "address": "10.0.0.2", "devices": [device or _device()]}
    return pb.RegisterNodeRequest(**{**base, **fields})


def _beat(node_id: str, **host: Any) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(node_id=node_id, host=tpb.HostTelemetry(**host))


def _gpu_beat(node_id: str, **device: Any) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(node_id=node_id, devices=[tpb.DeviceTelemetry(**device)])


def _report(job_id: str, end_step: int = 10, **rank: Any) -> tpb.IntervalReport:
    stats: dict[str, Any] = {"rank": 0, "batch": 8, "steps": 10, "compute_s": 0.1, "step_s": 0.1}
    return tpb.IntervalReport(
        job_id=job_id,
        end_step=end_step,
        plan_version=1,
        ranks=[tpb.RankIntervalStats(**{**stats, **rank})],
    )


def _line(job_id: str, **line: Any) -> pb.AppendJobLogsRequest:
    return pb.AppendJobLogsRequest(job_id=job_id, lines=[pb.LogLine(**{"text": "x", **line})])


Case = Callable[[str, str], tuple[str, Any]]
#: (what is sent, method and request for a node id and a job id, the refusal's start).
CASES: list[tuple[str, Case, str]] = [
    (
        "compute_score 1e308",
        lambda n, j: ("RegisterNode", _register(_device(compute_score=1e308))),
        "RegisterNode: devices[0].compute_score: must be in [0, 100000], got 1e+308",
    ),
    (
        "compute_score inf",
        lambda n, j: ("RegisterNode", _register(_device(compute_score=INF))),
        "RegisterNode: devices[0].compute_score: must be a finite number, got inf",
    ),
    (
        "matmul_tflops NaN",
        lambda n, j: ("RegisterNode", _register(_device(matmul_tflops=NAN))),
        "RegisterNode: devices[0].matmul_tflops: must be a finite number, got nan",
    ),
    (
        "memory_bytes -1",
        lambda n, j: ("RegisterNode", _register(_device(memory_bytes=-1))),
        "RegisterNode: devices[0].memory_bytes: must be in [0, ",
    ),
    (
        "device name with OSC 52",
        lambda n, j: ("RegisterNode", _register(_device(name="A100" + CLIPBOARD))),
        "RegisterNode: devices[0].name: must be one printable line of at most 255 characters, got 'A100\\x1b]52;",
    ),
    (
        "device kind 99",
        lambda n, j: ("RegisterNode", _register(_device(kind=99))),
        "RegisterNode: devices[0].kind: unknown value 99",
    ),
    (
        "address with a screen clear",
        lambda n, j: ("RegisterNode", _register(address="10.0.0.2\x1b[2J")),
        "RegisterNode: address: must be one printable line",
    ),
    (
        "name with a bidi override",
        lambda n, j: ("RegisterNode", _register(name="n1\u202egpj.exe")),
        "RegisterNode: name: must be one printable line",
    ),
    (
        "cpu_count -4",
        lambda n, j: ("RegisterNode", _register(host=tpb.HostProfile(cpu_count=-4))),
        "RegisterNode: host.cpu_count: must be in [0, 65536], got -4",
    ),
    (
        "ram_bytes -1",
        lambda n, j: ("RegisterNode", _register(host=tpb.HostProfile(ram_bytes=-1))),
        "RegisterNode: host.ram_bytes: must be in [0, ",
    ),
    (
        "cpu_model with escapes",
        lambda n, j: (
            "RegisterNode",
            _register(host=tpb.HostProfile(cpu_model="Xeon\x1b]0;pwned\x07")),
        ),
        "RegisterNode: host.cpu_model: must be one printable line",
    ),
    (
        "peer rtt NaN",
        lambda n, j: (
            "RegisterNode",
            _register(host=tpb.HostProfile(peer_links=[tpb.PeerLink(peer="n2", rtt_s=NAN)])),
        ),
        "RegisterNode: host.peer_links[0].rtt_s: must be a finite number",
    ),
    (
        "cpu_percent 1e308",
        lambda n, j: ("Heartbeat", _beat(n, cpu_percent=1e308)),
        "Heartbeat: host.cpu_percent: must be in [0, 100], got 1e+308",
    ),
    (
        "RAM -1",
        lambda n, j: ("Heartbeat", _beat(n, ram_total_bytes=-1)),
        "Heartbeat: host.ram_total_bytes: must be in [0, ",
    ),
    (
        "temperature inf",
        lambda n, j: ("Heartbeat", _gpu_beat(n, device_index=0, temperature_c=INF)),
        "Heartbeat: devices[0].temperature_c: must be a finite number, got inf",
    ),
    (
        "utilization 250 %",
        lambda n, j: ("Heartbeat", _gpu_beat(n, device_index=0, utilization_percent=250)),
        "Heartbeat: devices[0].utilization_percent: must be in [0, 100], got 250",
    ),
    (
        "throttle reason with a newline",
        lambda n, j: (
            "Heartbeat",
            _gpu_beat(n, device_index=0, throttle=tpb.ThrottleReasons(reasons=["hw\nslowdown"])),
        ),
        "Heartbeat: devices[0].throttle.reasons[0]: must be one printable line",
    ),
    (
        "sampled_at NaN",
        lambda n, j: ("Heartbeat", pb.HeartbeatRequest(node_id=n, sampled_at_unix_s=NAN)),
        "Heartbeat: sampled_at_unix_s: must be a finite number",
    ),
    (
        "end_step 2^63-1",
        lambda n, j: ("ReportIntervalStats", _report(j, end_step=2**63 - 1)),
        "ReportIntervalStats: end_step: must be in [0, 2147483647], got 9223372036854775807",
    ),
    (
        "compute_s NaN",
        lambda n, j: ("ReportIntervalStats", _report(j, compute_s=NAN)),
        "ReportIntervalStats: ranks[0].compute_s: must be a finite number",
    ),
    (
        "busy_cv inf",
        lambda n, j: ("ReportIntervalStats", _report(j, busy_cv=INF)),
        "ReportIntervalStats: ranks[0].busy_cv: must be a finite number",
    ),
    (
        "peak memory -1",
        lambda n, j: ("ReportIntervalStats", _report(j, peak_memory_bytes=-1)),
        "ReportIntervalStats: ranks[0].peak_memory_bytes: must be in [0, ",
    ),
    (
        "rank -1",
        lambda n, j: (
            "ReportRankStatus",
            pb.ReportRankStatusRequest(node_id=n, job_id=j, rank=-1, state=pb.RANK_STATE_RUNNING),
        ),
        "ReportRankStatus: rank: must be in [0, ",
    ),
    (
        "rank state 42",
        lambda n, j: (
            "ReportRankStatus",
            pb.ReportRankStatusRequest(node_id=n, job_id=j, state=42),
        ),
        "ReportRankStatus: state: unknown value 42",
    ),
    (
        "exit message with NUL",
        lambda n, j: (
            "ReportRankStatus",
            pb.ReportRankStatusRequest(
                node_id=n, job_id=j, state=pb.RANK_STATE_EXITED, exit_code=1, message="bad\x00"
            ),
        ),
        "ReportRankStatus: message: must not hold NUL",
    ),
    (
        "log line time inf",
        lambda n, j: ("AppendJobLogs", _line(j, time_unix_s=INF)),
        "AppendJobLogs: lines[0].time_unix_s: must be a finite number",
    ),
    (
        "log line time in the year 5000",
        lambda n, j: ("AppendJobLogs", _line(j, time_unix_s=1e12)),
        "AppendJobLogs: lines[0].time_unix_s: must be in [0, 100000000000]",
    ),
    (
        "log stream 'stdin'",
        lambda n, j: ("AppendJobLogs", _line(j, stream="stdin")),
        "AppendJobLogs: lines[0]: stream must be stdout or stderr, got 'stdin'",
    ),
    (
        "job id of 10,000 characters",
        lambda n, j: ("GetJob", pb.GetJobRequest(job_id="x" * 10_000)),
        "GetJob: job_id: must be one printable line of at most 64 characters, got 'xxxx",
    ),
    (
        "job id with a title change",
        lambda n, j: ("CancelJob", pb.CancelJobRequest(job_id="\x1b]0;owned\x07")),
        "CancelJob: job_id: must be one printable line",
    ),
    (
        "logs limit -1",
        lambda n, j: ("GetJobLogs", pb.GetJobLogsRequest(job_id=j, limit=-1)),
        "GetJobLogs: limit: must be in [0, ",
    ),
    (
        "jobs limit -5",
        lambda n, j: ("ListJobs", pb.ListJobsRequest(limit=-5)),
        "ListJobs: limit: must be in [0, ",
    ),
    (
        "job states 77",
        lambda n, j: ("ListJobs", pb.ListJobsRequest(states=[77])),
        "ListJobs: states[0]: unknown value 77",
    ),
    (
        "attached rank score inf",
        lambda n, j: (
            "AttachJob",
            pb.AttachJobRequest(
                name="a",
                launcher="torchrun",
                global_batch=8,
                ranks=[pb.AttachedRank(host="h", compute_score=INF)],
            ),
        ),
        "AttachJob: ranks[0].compute_score: must be a finite number",
    ),
    (
        "attached steps 2^40",
        lambda n, j: (
            "AttachJob",
            pb.AttachJobRequest(name="a", launcher="torchrun", global_batch=8, steps=2**40),
        ),
        "AttachJob: steps: must be in [0, ",
    ),
    (
        "probe reply -1",
        lambda n, j: ("Probe", pb.ProbeRequest(reply_bytes=-1)),
        "Probe: reply_bytes: must be in [0, ",
    ),
    (
        "drain a node named with ESC",
        lambda n, j: ("DrainNode", pb.DrainNodeRequest(node="n1\x1b[A")),
        "DrainNode: node: must be one printable line",
    ),
]


@pytest.fixture
def placed(coordinator: Coordinator) -> tuple[str, str]:
    """A node and a job placed on it, its rank running: what each bad value aims at."""
    stub = coordinator.stub
    node_id = stub.RegisterNode(_register(), timeout=DEADLINE_S).node_id
    job = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=JOB), timeout=DEADLINE_S).job
    running = pb.ReportRankStatusRequest(
        node_id=node_id, job_id=job.id, rank=0, state=pb.RANK_STATE_RUNNING
    )
    stub.ReportRankStatus(running, timeout=DEADLINE_S)
    return node_id, job.id


@pytest.mark.parametrize(("sent", "case", "refusal"), CASES, ids=[c[0] for c in CASES])
def test_a_value_out_of_bounds_is_refused_in_one_line_naming_its_field(
    coordinator: Coordinator, placed: tuple[str, str], sent: str, case: Case, refusal: str
) -> None:
    node_id, job_id = placed
    method, request = case(node_id, job_id)
    with pytest.raises(grpc.RpcError) as err:
        getattr(coordinator.stub, method)(request, timeout=DEADLINE_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details = str(err.value.details())
    assert details.startswith(refusal), details
    assert details.isprintable() and len(details) < 300, details
    # Nothing of it was kept: the node and the job are as they were.
    (node,) = coordinator.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
    assert node.name == "n1" and node.address == "10.0.0.2"
    assert node.devices[0].compute_score == 1.0 and node.devices[0].name == "cpu"
    job = coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
    assert job.last_step == 0 and job.state == pb.JOB_STATE_RUNNING


def test_streams_refuse_bad_values_too(coordinator: Coordinator) -> None:
    watch = coordinator.stub.WatchCluster(pb.WatchClusterRequest(period_s=NAN), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        next(iter(watch))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "WatchCluster: period_s: must be a finite number, got nan"
    orders = coordinator.stub.WatchOrders(pb.WatchOrdersRequest(node_id="\x07" * 3), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        next(iter(orders))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_diverged_loss_is_kept_as_not_reported_not_refused(
    coordinator: Coordinator, placed: tuple[str, str]
) -> None:
    _, job_id = placed
    coordinator.stub.ReportIntervalStats(_report(job_id, loss_sum=NAN), timeout=DEADLINE_S)
    job = coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
    assert job.last_step == 10
    assert not job.live.HasField("loss")


def test_metrics_labels_never_carry_control_characters(
    coordinator: Coordinator, placed: tuple[str, str]
) -> None:
    """A node name an older coordinator stored with an escape sequence is exported
    escaped (the API refuses such names now; the database may still hold one)."""
    with coordinator.engine.begin() as conn:
        conn.execute(text("UPDATE nodes SET name = :n"), {"n": "n1" + CLIPBOARD})
    coordinator.restart()
    port = coordinator.server.serve_metrics("127.0.0.1:0")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        exposition = resp.read().decode()
    assert 'node="n1\\\\x1b]52;c;cm0gLXJmIH4=\\\\x07"' in exposition, exposition[-2000:]
    assert "\x1b" not in exposition and "\x07" not in exposition
