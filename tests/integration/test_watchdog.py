"""The agent's watchdog and the no-orphans rule, with a real agent and coordinator.

A rank that neither prints nor steps (a user command stuck for good, with a
child process of its own) is killed by the agent after ``--watchdog`` seconds,
its whole process group with it, and reported: the job fails with the reason.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.slow

#: Seconds past the watchdog in which the job must be reported failed.
SLACK_S = 20

STUCK = """\
name: stuck
command: ["{python}", "-c", "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"]
global_batch: 8
steps: 10
resources: {{ranks: 1, device: cpu}}
"""


def test_a_rank_without_progress_is_killed_with_its_children_and_reported(tmp_path: Path) -> None:
    import sys

    agents = [AgentSpec("node-a", watchdog_s=4)]
    with LocalCluster(
        tmp_path / "cluster", agents, heartbeat_interval_s=0.5, heartbeat_timeout_s=4
    ) as cluster:
        job_id = cluster.submit(STUCK.format(python=sys.executable))
        deadline = time.monotonic() + 30
        procs: list[psutil.Process] = []
        while time.monotonic() < deadline and len(procs) < 2:
            procs = psutil.Process(cluster.procs["node-a"].pid).children(recursive=True)
            time.sleep(0.1)
        assert len(procs) >= 2, "the rank and its child run"
        started = time.monotonic()
        job = cluster.wait(job_id, timeout_s=60)
        took = time.monotonic() - started
        _, alive = psutil.wait_procs(procs, timeout=30)
    assert job.state == pb.JOB_STATE_FAILED
    # The reason gives the silence the agent measured, rounded: 4 s, or more when a loaded
    # host delays its tick past 4.5 s.
    said = re.search(r"exited with code 137 \(watchdog: no progress for (\d+) s\)", job.message)
    assert said and int(said.group(1)) >= 4, job.message
    # Killed by the watchdog, not left to run: well before the 600 s the rank sleeps, with
    # room for a loaded host's slow ticks, reports and polls.
    assert took < 4 + SLACK_S, f"killed within the watchdog plus a few ticks, took {took:.1f} s"
    assert not alive, "no orphans: the rank's child went with it"
