"""No orphans after a ``kill -9`` of the agent (issue 17 item 9), with a real agent and
coordinator: a rank that started a child of its own; the agent is killed and started
again; soon after no process of the job is left, and the job learns its rank ended (the
time it took is printed: a figure, not a bound a loaded host could break)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.slow

#: Seconds within which a process of the job must have ended (its grandchild sleeps 600).
ENDED_S = 30

#: A rank that starts a grandchild (the kind of process that outlived a killed agent).
FAMILY = """\
name: family
command: ["{python}", "-c", "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"]
global_batch: 8
steps: 10
resources: {{ranks: 1, device: cpu}}
"""


def test_a_killed_agent_leaves_no_process_of_its_jobs_once_restarted(tmp_path: Path) -> None:
    spec = AgentSpec("node-a")
    with LocalCluster(
        tmp_path / "cluster", [spec], heartbeat_interval_s=0.5, heartbeat_timeout_s=30
    ) as cluster:
        job_id = cluster.submit(FAMILY.format(python=sys.executable))
        deadline = time.monotonic() + 60
        procs: list[psutil.Process] = []
        while time.monotonic() < deadline and len(procs) < 2:
            procs = psutil.Process(cluster.procs["node-a"].pid).children(recursive=True)
            time.sleep(0.1)
        assert len(procs) >= 2, "the rank and its child run"
        rank, child = procs[0], procs[-1]
        assert child.ppid() == rank.pid
        cluster.kill("node-a")
        # The rank goes with the agent (PR_SET_PDEATHSIG); its child is reparented, alive.
        _, alive = psutil.wait_procs([rank], timeout=ENDED_S)
        assert not alive, "the rank died with its agent"
        assert child.is_running(), "the grandchild outlived the agent (what is to be ended)"
        assert child.ppid() != rank.pid

        restarted = time.monotonic()
        cluster.start_agent(spec)
        # The new agent starts (imports, state directory) and then ends the leftovers: on a
        # loaded two-core host its start alone can take seconds.
        _, alive = psutil.wait_procs(procs, timeout=ENDED_S)
        took = time.monotonic() - restarted
        assert not alive, f"processes of the job alive {ENDED_S} s after the restart: {alive}"
        job = cluster.wait(job_id, timeout_s=60)
    assert job.state == pb.JOB_STATE_FAILED
    assert "leftover processes" in job.message, job.message
    print(f"leftovers of the killed agent ended {took:.2f} s after its restart")
