"""Issue 17's findings 5 and 7 re-run against a real coordinator (gRPC on port 0, SQLite):
a flood of submissions is queued within the limits and refused beyond them while
the agents' polls stay fast; unauthenticated peers cannot make the server buffer
large messages; calls beyond ``concurrent_rpcs`` are refused, not queued."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import psutil
import pytest
from simcluster import watch_orders

from hetero.coordinator.admission import Limits
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

SPEC = "name: flood{n}\nglobal_batch: 8\nsteps: 10\nresources:\n  ranks: 1\n  device: cpu\n"

SERVER = """
import sys, time
from hetero.security.auth import Secret
from hetero.security.transport import ServerSecurity
from hetero.coordinator.admission import Limits
from hetero.coordinator.server import Settings, create_server
settings = Settings(db_url=sys.argv[1], limits=Limits(concurrent_rpcs=2))
server, port = create_server("127.0.0.1:0", settings, ServerSecurity(token=Secret("t" * 32)))
server.start()
print(port, flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_flood_of_submissions_is_queued_within_the_limit_and_refused_beyond(coordinator) -> None:  # type: ignore[no-untyped-def]
    """Finding 5 at a twentieth of its scale, to stay quick on a 2-core host: 500
    submissions against a limit of 250 (10,000 were all accepted, every rank on one
    CPU device, and the node's orders then took 14 s to read)."""
    object.__setattr__(coordinator.settings, "limits", Limits(jobs_per_user=250))
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    node_id = coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(name="n1", address="n1.local", devices=[device]), timeout=5
    ).node_id

    def submit(n: int) -> str:
        try:
            request = pb.SubmitJobRequest(spec_yaml=SPEC.format(n=n))
            return pb.JobState.Name(coordinator.stub.SubmitJob(request, timeout=30).job.state)
        except grpc.RpcError as exc:
            return str(exc.code().name)

    with futures.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(submit, range(500)))
    counts = {o: outcomes.count(o) for o in set(outcomes)}
    assert counts == {"JOB_STATE_PENDING": 8, "JOB_STATE_QUEUED": 242, "RESOURCE_EXHAUSTED": 250}

    # What made the orders slow was their size (every rank of 10,000 jobs): bounded here
    # by count, and the read by its call's deadline, not by wall time a loaded host stretches.
    orders = watch_orders(coordinator.stub, node_id)
    assert len(orders.launches) == 8, "8 ranks on the CPU device (ranks_per_cpu_device), no more"
    pending = pb.ListJobsRequest(states=[pb.JOB_STATE_PENDING])
    ports = [j.master_port for j in coordinator.stub.ListJobs(pending, timeout=30).jobs]
    assert len(ports) == len(set(ports)) == 8


def _server(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, f"sqlite:///{tmp_path / 'c.db'}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _refused_once(port: int) -> None:
    """One small unauthenticated call, refused: the server is up and has run that path."""
    with (
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        pb_grpc.CoordinatorStub(channel).ListNodes(pb.ListNodesRequest(), timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_unauthenticated_large_messages_are_refused_before_they_are_buffered(
    tmp_path: Path,
) -> None:
    """Finding 7: 64 unauthenticated 15 MiB messages grew the server by 700 MB, kept
    afterwards. Here 64 of 7 MiB (the limit is 8 MiB): refused, and the server grows
    by less than 32 MiB (the old refusal, after reading each whole, grew it by 470 MiB
    at its peak; with gRPC's growing flow-control windows, 20-100 MiB)."""
    proc, port = _server(tmp_path)
    try:
        server = psutil.Process(proc.pid)
        _refused_once(port)  # the refusal's path warmed up: its first use is no growth
        before = server.memory_info().rss
        peak = [before]
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        )
        stub = pb_grpc.CoordinatorStub(channel)
        big = pb.AppendJobLogsRequest(
            job_id="x", lines=[pb.LogLine(text="a" * (1 << 20)) for _ in range(7)]
        )
        codes: list[str] = []
        done = threading.Event()

        def call() -> None:
            try:
                stub.AppendJobLogs(big, timeout=30)
            except grpc.RpcError as exc:
                codes.append(exc.code().name)

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], server.memory_info().rss)
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        callers = [threading.Thread(target=call) for _ in range(64)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        done.set()
        watcher.join()
        channel.close()
        assert set(codes) <= {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED"} and len(codes) == 64
        assert "UNAUTHENTICATED" in codes
        grown_mib = (peak[0] - before) / 2**20
        assert grown_mib < 32, f"the server grew by {grown_mib:.0f} MiB refusing them"
    finally:
        proc.kill()
        proc.wait()


def test_calls_beyond_concurrent_rpcs_are_refused_not_queued(tmp_path: Path) -> None:
    proc, port = _server(tmp_path)  # concurrent_rpcs=2
    try:
        token = [("authorization", "Bearer " + "t" * 32)]
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.CoordinatorStub(channel)
        watches = [
            stub.WatchCluster(pb.WatchClusterRequest(period_s=1.0), metadata=token, timeout=30)
            for _ in range(2)
        ]
        for w in watches:
            next(w)  # both streams are open and held by the server
        try:
            stub.ListNodes(pb.ListNodesRequest(), metadata=token, timeout=5)
            raise AssertionError("a third call was served beyond concurrent_rpcs=2")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        for w in watches:
            w.cancel()
        # The server frees their slots once it has seen the cancellations: served again.
        deadline = time.monotonic() + 30
        while True:
            try:
                nodes = stub.ListNodes(pb.ListNodesRequest(), metadata=token, timeout=5).nodes
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                assert time.monotonic() < deadline, "the ended streams' slots were not freed"
                time.sleep(0.1)
        assert not nodes
        channel.close()
    finally:
        proc.kill()
        proc.wait()
