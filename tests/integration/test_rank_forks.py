"""A rank that holds a gRPC channel while its DataLoader forks workers (an attached
job's rank 0, a rank under an agent) prints no gRPC fork-handler line per worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap

RANK = textwrap.dedent(
    """
    import threading
    from concurrent import futures

    from hetero import trainer  # noqa: F401  (first, as a training script imports it)

    import grpc
    import torch
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from torch.utils.data import DataLoader, TensorDataset

    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    done = threading.Event()

    def poll():  # calls in flight whenever a worker forks
        while not done.is_set():
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)

    poller = threading.Thread(target=poll)
    poller.start()
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2)
    for _ in range(3):
        assert sum(len(b[0]) for b in loader) == 64
    done.set()
    poller.join()
    server.stop(0)
    print("trained")
    """
)


def test_data_loader_workers_forked_beside_grpc_calls_log_no_fork_handler_lines() -> None:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RANK], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-2000:]
    err = done.stderr
    assert "fork_posix" not in err and "fork() handlers" not in err, err[-2000:]
