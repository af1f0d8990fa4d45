"""The control plane on a GPU host with a neighbour on GPU 1, as a new user would run it.

A process keeps GPU 1 busy with bf16 matmuls before anything starts. Then
``hetero-coord serve``, one ``hetero-agent run`` holding every GPU, and
``hetero-coord submit --wait`` of a built-in bf16 job and of a ``command:`` job
using the trainer API. The initial plan (version 1, made from the agents'
profiles alone) must give the unshared GPU 0 the larger share (on a host with
more than two GPUs, placement must leave the shared GPU out), and both jobs
must succeed.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.core.nvml import Nvml
from hetero.v1 import coordinator_pb2 as pb

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_loop.py"

# Sees GPU 1 alone (CUDA_VISIBLE_DEVICES in the fixture): a process that only names
# cuda:1 may still open a context on GPU 0, and then both GPUs are rightly shared.
NEIGHBOUR = """
import torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
b = torch.randn_like(a)
torch.cuda.synchronize()
print("busy", flush=True)
while True:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""

BUILT_IN = """\
name: gpu-bf16
model: resnet18
global_batch: 256
steps: 40
amp: bf16
policy: dynamic
rebalance_interval: 5
resources:
  ranks: 2
  device: cuda
"""

COMMAND = f"""\
name: gpu-command
command: [{sys.executable}, {EXAMPLE}, --steps, "60", --global-batch, "128"]
global_batch: 128
steps: 60
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 2
  device: cuda
"""


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "busy"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


def _submit(cluster: LocalCluster, job_file: Path) -> str:
    cli = [sys.executable, "-m", "hetero.coordinator.cli"]
    done = subprocess.run(
        [
            *cli,
            "submit",
            str(job_file),
            "--wait",
            "--coordinator",
            cluster.address,
            "--token-file",
            str(cluster.token_path),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stderr
    return done.stdout.split()[0]


def _initial_plan_by_device(db: Path, job_id: str) -> dict[int, int]:
    conn = sqlite3.connect(db)
    (batches,) = conn.execute(
        "SELECT batches FROM plans WHERE job_id = ? AND version = 1", (job_id,)
    ).fetchone()
    plan = [int(b) for b in batches.split(",")]
    ranks = conn.execute(
        "SELECT rank, device_index FROM ranks WHERE job_id = ?", (job_id,)
    ).fetchall()
    return {device: plan[rank] for rank, device in ranks}


def test_a_neighbour_on_gpu_1_gives_gpu_0_the_larger_initial_share(
    tmp_path: Path, neighbour: subprocess.Popen[str]
) -> None:
    nvml_sees_it = neighbour.pid in (Nvml().running_pids(1) or ())
    # Whatever holds GPU 0 before the agent starts (another user, or this test process
    # after an earlier test) makes it shared too: the flag must say what NVML saw.
    on_0 = {p: _cmdline(p) for p in Nvml().running_pids(0) or ()}
    with LocalCluster(tmp_path / "cluster", [AgentSpec("gpu-node")]) as cluster:
        (node,) = cluster.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes
        gpu = {d.index: d for d in node.devices}
        print(
            {i: (d.compute_score, list(d.suspect), d.shared_while_profiled) for i, d in gpu.items()}
        )
        assert not gpu[0].suspect and not gpu[1].suspect
        if nvml_sees_it:  # in a container without the host's pids NVML lists none
            assert gpu[1].shared_while_profiled, gpu[1]
            assert gpu[0].shared_while_profiled == bool(on_0), f"on GPU 0 before: {on_0}"
        assert gpu[0].compute_score > gpu[1].compute_score
        for name, spec in (("built-in.yaml", BUILT_IN), ("command.yaml", COMMAND)):
            job_file = tmp_path / name
            job_file.write_text(spec)
            job_id = _submit(cluster, job_file)
            share = _initial_plan_by_device(
                tmp_path / "cluster" / "coordinator" / "coordinator.db", job_id
            )
            if len(gpu) == 2:  # both GPUs hold a rank: the shared one the smaller share
                assert share[0] > share[1], f"{name}: initial plan by device {share}"
            else:  # two ranks, more GPUs: placement leaves the shared one out
                assert 1 not in share and len(share) == 2, f"{name}: placed on {share}"
