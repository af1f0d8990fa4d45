"""``hetero-coord submit --wait`` on a job whose rank fails shows why: the failing rank's
last output lines, not only "failed (rank 1 exited with code 2)" (issue #34: the cause
took a separate ``logs`` call). A real coordinator and agent run the job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster

pytestmark = pytest.mark.slow

#: Rank 1 prints 30 lines and a last error, then exits 2; rank 0 waits until it is
#: stopped (so it, too, exits non-zero, after the failure).
SCRIPT = """\
import os, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
if rank == 0:
    print("rank 0 is waiting", flush=True)
    time.sleep(120)
for i in range(30):
    print(f"step {i}", flush=True)
# Two pipes, each read by a thread of the agent's: the error is written once the agent
# has logged the last step (in rank1.log beside this rank's directory), so that it is
# read after the steps however late a loaded host runs the stdout reader.
log, deadline = Path.cwd().parent / f"rank{rank}.log", time.monotonic() + 60
while time.monotonic() < deadline and "step 29" not in (log.read_text() if log.exists() else ""):
    time.sleep(0.05)
time.sleep(0.3)  # and the reader has queued the line it logged
print("ValueError: bad shape", file=sys.stderr, flush=True)
sys.exit(2)
"""
JOB = """\
name: fails
command: {command}
global_batch: 8
steps: 2
resources: {{ranks: 2, device: cpu}}
"""


def test_submit_wait_prints_the_failing_ranks_last_lines(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(SCRIPT)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB.format(command=json.dumps([sys.executable, str(script)])))
    submit = [sys.executable, "-m", "hetero.coordinator.cli", "submit", str(job_file), "--wait"]
    with LocalCluster(tmp_path / "cluster", [AgentSpec("node-a")]) as cluster:
        waited = subprocess.run(
            [*submit, "--coordinator", cluster.address, "--token-file", str(cluster.token_path)],
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert waited.returncode == 1, waited.stderr
    lines = waited.stderr.splitlines()
    assert lines[-22].endswith(": failed (rank 1 exited with code 2)"), waited.stderr
    job_id = waited.stdout.strip()
    assert lines[-21] == f"last 20 lines of rank 1 (all: hetero-coord logs {job_id} --rank 1):"
    shown = [f"  [rank 1 stdout] step {i}" for i in range(11, 30)]
    assert lines[-20:] == [*shown, "  [rank 1 stderr] ValueError: bad shape"], waited.stderr
