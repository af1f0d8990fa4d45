"""SIGTERM stops a job after a step all ranks agree on, with its state checkpointed:
real Gloo ranks, resumed to the losses of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.core.states import JobState
from hetero.trainer.checkpoint import read_checkpoint
from hetero.trainer.launch import free_port, rank_env
from hetero.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

WORKERS = Path(__file__).parent / "workers"
SHARDS = ["none", "full"]


@pytest.fixture(scope="module")
def loops(ranks_in_turn, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """drain_loop.py's phases, replicated and sharded, on one launch of 2 ranks."""
    out = tmp_path_factory.mktemp("drain-loops")
    jobs = [
        ["drain_loop.py", str(out / f"{phase}-{shard}.pt"), phase, shard]
        for shard in SHARDS
        for phase in ("full", "stop", "resume")
    ]
    ranks_in_turn(out, 2, jobs)
    return out


@pytest.mark.parametrize("shard", SHARDS)
def test_a_loop_stops_at_one_step_on_sigterm_and_resumes_to_the_uninterrupted_losses(
    loops: Path, shard: str
):
    """Rank 0 alone is signalled after step 7: the flag issued at step 8 is read at step 9,
    where both ranks stop and checkpoint (inside an interval); resuming gives the
    losses of a run never stopped."""
    stopped = torch.load(loops / f"stop-{shard}.pt")
    assert stopped["stopped_at"] == 9
    assert [torch.load(loops / f"stop-{shard}.pt.rank{r}") for r in range(2)] == [9, 9]
    assert read_checkpoint(loops / f"drain-{shard}.pt")["global_step"] == 9
    full = torch.load(loops / f"full-{shard}.pt")["losses"]
    resumed = torch.load(loops / f"resume-{shard}.pt")["losses"]
    assert sorted(resumed) == list(range(10, 17))
    for step, loss in resumed.items():
        assert loss == pytest.approx(full[step], rel=1e-6), step


TINY = ["--model", "debug", "--num-samples", "960", "--global-batch", "48", "--quiet"]
COMMON = [*TINY, "--nproc", "2", "--rebalance-interval", "4", "--policy", "equal"]
COMMON += ["--ideal-steps", "0", "--eval-samples", "0", "--checkpoint-interval", "1000"]
STEPS = "120"


def _hetero_train(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hetero.trainer.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _first_record(metrics: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (metrics.is_file() and metrics.read_text().strip()):
        assert time.monotonic() < deadline, f"no interval record in {metrics}"
        time.sleep(0.05)


def test_hetero_train_sigtermed_mid_run_checkpoints_exits_143_and_resumes_exactly(
    tmp_path: Path,
):
    """SIGTERM to the launcher alone (a container's first process): every rank gets it
    once, they stop at one step, rank 0 checkpoints it despite an interval of 1000 and
    all exit 143; resumed, the losses are an uninterrupted run's."""
    full, part = tmp_path / "full", tmp_path / "part"
    reference = _hetero_train(*COMMON, "--steps", STEPS, "--output-dir", str(full))
    stopped = _hetero_train(*COMMON, "--steps", STEPS, "--output-dir", str(part))
    _first_record(part / "metrics" / "rank0.jsonl")
    stopped.send_signal(signal.SIGTERM)
    _, err = stopped.communicate(timeout=60)
    assert stopped.returncode == 143, err
    line = re.search(r"stopping at step (\d+) on SIGTERM: checkpoint written to (\S+)", err)
    assert line, err
    step = int(line.group(1))
    assert 4 <= step < int(STEPS)
    assert read_checkpoint(Path(line.group(2)))["global_step"] == step
    assert "error" not in err, err
    resumed = _hetero_train(
        *COMMON, "--steps", STEPS, "--output-dir", str(part), "--resume", "auto"
    )
    for proc in (reference, resumed):
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    ref = {r["step"]: r["loss"] for r in read_metrics(full / "metrics" / "rank0.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(part / "metrics" / "rank0.jsonl")}
    after = [s for s in got if s - 4 >= step]  # whole intervals run after the resume
    assert after and max(after) == int(STEPS)
    for s in after:
        assert got[s] == pytest.approx(ref[s], rel=1e-6), s


def test_a_second_sigterm_kills_at_once(tmp_path: Path):
    """Who insists gets the old behaviour: the second SIGTERM ends the process by the
    signal's default action, without waiting for a step."""
    script = (
        "import os, signal, time\n"
        "from hetero.trainer.drain import StopRequest\n"
        "stop = StopRequest(1)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert stop.signalled and stop.poll(1)\n"
        "print('flagged', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout == "flagged\n", proc.stderr
    assert proc.returncode == -signal.SIGTERM


def test_a_rank_stuck_on_a_silent_peer_ends_soon_after_sigterm(tmp_path: Path):
    """A rank blocked in a collective (its peer stopped answering) never reaches the next
    step: the watcher ends it with 143 within its bound, long before the collective's
    timeout, so a failed job's restart does not wait for the SIGKILL."""
    script = (
        "import sys, time, torch, torch.distributed as dist\n"
        "from hetero.trainer.drain import StopRequest\n"
        "dist.init_process_group('gloo')\n"
        "stop = StopRequest(2)\n"
        "for step in range(1, 4):\n"
        "    time.sleep(0.05); stop.poll(step)\n"
        "print('ready', flush=True)\n"
        "if dist.get_rank() == 1:\n"
        "    time.sleep(120)\n"  # alive, silent: a peer hung on its device
        "dist.all_reduce(torch.ones(1))\n"  # rank 0 blocks here
    )
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=rank_env(r, 2, port, threads=1),
        )
        for r in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        time.sleep(0.5)  # rank 0 inside the all-reduce
        t0 = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        _, err = procs[0].communicate(timeout=30)
        took = time.monotonic() - t0
        assert procs[0].returncode == 143, err
        assert "stuck" in err
        assert took < 10.0  # the agent's default grace; the bound here is 2 s
    finally:
        for p in procs:
            p.kill()
            p.communicate()


SHED = """\
name: drain
model: debug
global_batch: 16
steps: 1500
policy: dynamic
rebalance_interval: 4
emulate_slowdown: {{1: 32}}
checkpoint: {{dir: {ckpt}, interval_steps: 1000}}
resources: {{ranks: 2, device: cpu}}
"""


def test_a_coordinator_restart_resumes_from_the_step_its_ranks_drained_at(tmp_path: Path):
    """The coordinator restarts the job without its 32x slower rank (an exclusion: every
    rank healthy): the agent SIGTERMs both, they stop at one step and checkpoint it, long
    before the first periodic checkpoint (step 1000); the one-rank attempt resumes there,
    and the drained exits are confirmations, not failures."""
    root = tmp_path / "cluster"
    with LocalCluster(root, [AgentSpec("node")]) as cluster:
        job_id = cluster.submit(SHED.format(ckpt=cluster.job_files / "ckpt"))
        job = cluster.wait(job_id, timeout_s=120)
        text = "\n".join(line.text for line in cluster.logs(job_id))
    assert JobState(job.state) is JobState.SUCCEEDED, job.message
    assert job.world_size == 1, "restarted without the slow rank"
    drained = re.findall(r"stopping at step (\d+) on SIGTERM", text)
    assert len(drained) == 1, text
    step = int(drained[0])
    assert 0 < step < 1000
    assert re.search(rf"resumed from \S+ at step {step}\b", text), text
    db = sqlite3.connect(root / "coordinator" / "coordinator.db")
    restarts, exclusion_restarts = db.execute(
        "SELECT restarts, exclusion_restarts FROM jobs WHERE id = ?", (job_id,)
    ).fetchone()
    assert (restarts, exclusion_restarts) == (1, 1), "no failure restart"
    first = db.execute(
        "SELECT MIN(end_step) FROM interval_stats WHERE job_id = ? AND plan_version >= "
        "(SELECT attempt_first_plan FROM jobs WHERE id = ?)",
        (job_id, job_id),
    ).fetchone()[0]
    assert step < first <= step + 2 * 4, "the restarted attempt's intervals start there"
