"""Ranks that see only Slurm's task variables form one group (no Slurm needed here:
the processes get the variables srun gives its tasks; ``make test-slurm`` runs srun).

Before ``hetero.trainer.slurm``, two processes started so each trained alone on the
whole global batch and printed its report as rank 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.trainer.launch import free_port

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_loop.py"
#: Variables of another launcher that must not leak into the emulated tasks.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HETERO_LAUNCHED",
    "HETERO_BACKEND",
)


def _task_env(procid: int, ntasks: int, port: int, *, step: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(
        SLURM_JOB_ID="4242",
        SLURM_NTASKS=str(ntasks),
        SLURM_PROCID=str(procid),
        SLURM_LOCALID=str(procid),
        SLURM_NODEID="0",
        SLURM_JOB_NODELIST="localhost",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        MASTER_PORT=str(port),  # the job id's port (19242) might be taken on a shared host
    )
    if step:
        env.update(
            SLURM_STEP_ID="0",
            SLURM_STEP_NODELIST="localhost",
            SLURM_STEP_TASKS_PER_NODE=str(ntasks),
        )
    return env


def test_tasks_with_slurms_variables_form_one_group(tmp_path: Path) -> None:
    port = free_port()
    args = [sys.executable, str(EXAMPLE), "--steps", "20", "--output-dir", str(tmp_path)]
    procs = [
        subprocess.Popen(
            args,
            env=_task_env(r, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    done = [line for out, _ in outs for line in out.splitlines() if line.startswith("done:")]
    assert len(done) == 1, done  # rank 0 alone reports
    run = json.loads((tmp_path / "metrics" / "run.json").read_text())
    assert run["world_size"] == 2
    records = [
        json.loads(line)
        for r in range(2)
        for line in (tmp_path / "metrics" / f"rank{r}.jsonl").read_text().splitlines()
    ]
    assert {sum(rec["plan"]) for rec in records} == {128}  # the global batch, split


def test_batch_shell_of_several_tasks_fails_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "2"],
        env=_task_env(0, 3, free_port(), step=False),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "SLURM_NTASKS=3 but this process is not one task of an srun step" in last
