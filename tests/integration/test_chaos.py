"""Chaos: real faults injected into a real cluster on loopback.

A coordinator and two agents run as processes (``hetero-coord serve``,
``hetero-agent run``), the agents launch Gloo ranks of a ``debug`` job that
checkpoints every 50 steps, and the test does to them what production does:

- ``kill -9`` of an agent mid-job: its rank dies with it (PDEATHSIG), the other
  rank loses its peer; the node misses its heartbeat timeout and is marked
  down; the job restarts from its checkpoint on the remaining agent and
  completes;
- ``kill -9`` of one rank: the job restarts on both agents and completes;
- ``kill -9`` of the coordinator, restarted on the same database a few seconds
  later: training never stops, nothing restarts, and the interval statistics
  reported during the outage reach the database from the agents' outboxes.

Each run's final loss is compared with an uninterrupted single-process run of
the same job (same seed, data order and global batch; the debug model has no
BatchNorm, so the split between ranks does not change the math). The
tolerance is the float noise of summing in another order: two uninterrupted
single-process runs that differ only in their thread count (1 vs 2) differ by
at most 1.2e-5 (relative) in any interval loss up to step 500 — and by up to
8% after step 600, where this tiny model's SGD amplifies the noise
chaotically. So the job runs 400 steps (slowed by an EMULATED 40x slowdown on
both ranks, ``min_batch: 16`` keeping the split even, so that a fault lands
mid-job) and the final loss must agree within 1e-4; the rank kill, which also runs in
``make test``, runs the first 200 of those steps (its kill at step 100 is mid-job
still). With ``HETERO_CHAOS_REPORT=DIR`` every
test writes its figures (times to detect and recover, restarts, losses, rows)
to ``DIR/<test>.json``; ``make chaos`` runs all four and collects them (the
rank kill also runs in ``make test``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.v1 import coordinator_pb2 as pb

#: The rank kill runs in ``make test`` (about half a minute here); the others in ``make chaos``.
pytestmark = pytest.mark.slow

STEPS = 400
#: The rank kill's job: half as long, its fault at step 100 still mid-job.
RANK_KILL_STEPS = 200
INTERVAL = 5
GLOBAL_BATCH = 32
JOB = """\
name: chaos
model: debug
global_batch: {batch}
steps: {steps}
lr: 0.05
seed: 3
policy: dynamic
min_batch: 16
rebalance_interval: {interval}
max_restarts: 2
collective_timeout_s: 30
checkpoint: {{dir: {ckpt}, interval_steps: 50}}
resources: {{ranks: 2, device: cpu}}
emulate_slowdown: [40, 40]
"""
#: Relative tolerance of the final loss against the uninterrupted run (see module doc).
LOSS_RTOL = 1e-4
#: Heartbeat settings of the chaos clusters: detection within about 4.5 s.
HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 4.0


@dataclass
class Timeline:
    """Job snapshots polled every 0.1 s, with perf_counter times."""

    t0: float = field(default_factory=time.perf_counter)
    #: (time, state, restarts, last step) of each snapshot.
    seen: list[tuple[float, int, int, int]] = field(default_factory=list)
    #: Every rank process seen while following the job (for the no-orphans check).
    ranks: dict[int, psutil.Process] = field(default_factory=dict)

    def first(self, pred: Any) -> float | None:
        return next((t - self.t0 for t, st, r, step in self.seen if pred(st, r, step)), None)


def _ckpt(tmp_path: Path) -> Path:
    """The job's checkpoint.dir: under the cluster's allowed root (``LocalCluster.job_files``)."""
    return tmp_path / "cluster" / "job-files" / "ckpt"


def _spec(tmp_path: Path, steps: int = STEPS) -> str:
    return JOB.format(batch=GLOBAL_BATCH, steps=steps, interval=INTERVAL, ckpt=_ckpt(tmp_path))


def _cluster(tmp_path: Path) -> LocalCluster:
    agents = [AgentSpec("node-a", watchdog_s=60), AgentSpec("node-b", watchdog_s=60)]
    return LocalCluster(
        tmp_path / "cluster",
        agents,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
    )


def _job(cluster: LocalCluster, job_id: str) -> pb.Job:
    return cluster.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5.0)


def _wait_for(cluster: LocalCluster, job_id: str, pred: Any, timeout_s: float, what: str) -> pb.Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = _job(cluster, job_id)
        if pred(job):
            return job
        if job.state in (pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED):
            raise AssertionError(f"job ended {pb.JobState.Name(job.state)}: {job.message}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; job is {_job(cluster, job_id)}")


def _follow(cluster: LocalCluster, job_id: str, timeline: Timeline, timeout_s: float) -> pb.Job:
    """Poll until the job finishes, recording every snapshot; tolerate a coordinator outage."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            job = _job(cluster, job_id)
        except Exception:  # the coordinator is down (chaos)
            time.sleep(0.1)
            continue
        timeline.seen.append((time.perf_counter(), job.state, job.restarts, job.last_step))
        timeline.ranks.update((p.pid, p) for p in _all_ranks(cluster))
        if job.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish within {timeout_s:.0f} s")


def _ranks(cluster: LocalCluster, agent: str) -> list[psutil.Process]:
    procs = psutil.Process(cluster.procs[agent].pid).children(recursive=True)
    return [p for p in procs if "hetero.trainer.cli" in " ".join(p.cmdline())]


def _all_ranks(cluster: LocalCluster) -> list[psutil.Process]:
    found = []
    for name, proc in cluster.procs.items():
        if name != "coordinator" and proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                found += _ranks(cluster, name)
    return found


def _no_orphans(cluster: LocalCluster, timeline: Timeline) -> int:
    """Stop the cluster; every rank process ever seen must be gone. Returns their number."""
    cluster.stop()
    alive = _gone(list(timeline.ranks.values()), 10.0)
    assert not alive, f"orphaned ranks: {[p.pid for p in alive]}"
    return len(timeline.ranks)


def _final_loss(cluster: LocalCluster, job_id: str, steps: int = STEPS) -> float:
    """Rank 0's summary of the last attempt: the mean loss of the last interval."""
    found = sorted(
        cluster.root.glob(f"node-*/jobs/{job_id}/rank0/summary.json"),
        key=lambda p: p.stat().st_mtime,
    )
    assert found, "rank 0 of the last attempt wrote its summary"
    summary = json.loads(found[-1].read_text())
    assert summary["steps"] == steps
    return float(summary["loss_last"])


def _interval_rows(cluster: LocalCluster, job_id: str) -> set[tuple[int, int]]:
    db = sqlite3.connect(cluster.root / "coordinator" / "coordinator.db")
    rows = db.execute("SELECT end_step, rank FROM interval_stats WHERE job_id = ?", (job_id,))
    return set(rows.fetchall())


def _events(cluster: LocalCluster, job_id: str | None = None) -> list[tuple[float, str, str]]:
    db = sqlite3.connect(cluster.root / "coordinator" / "coordinator.db")
    rows = db.execute("SELECT time_unix_s, kind, message FROM events ORDER BY id").fetchall()
    return [(t, k, m) for t, k, m in rows]


def _restart_figures(
    job: pb.Job, timeline: Timeline, loss: float, reference_loss: float, rank_processes: int
) -> dict[str, Any]:
    """What every restarted chaos job records: when it restarted and ran again, and how
    its final loss compares with the uninterrupted run."""
    return {
        "detect_job_restarting_s": timeline.first(lambda st, r, s: st == pb.JOB_STATE_RESTARTING),
        "recover_running_again_s": timeline.first(
            lambda st, r, s: r == 1 and st == pb.JOB_STATE_RUNNING
        ),
        "restarts": job.restarts,
        "message": job.message,
        "final_loss": loss,
        "reference_loss": reference_loss,
        "loss_rel_diff": abs(loss - reference_loss) / abs(reference_loss),
        "rank_processes_seen": rank_processes,
        "orphans": 0,
    }


def _record(name: str, figures: dict[str, Any]) -> None:
    out = os.environ.get("HETERO_CHAOS_REPORT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")


def _reference_loss(tmp_path_factory: pytest.TempPathFactory, steps: int) -> float:
    """The uninterrupted run: one process, same seed, data order, global batch and steps.
    It runs before the chaos job, never beside it: the job's emulated waits are 39 times
    its measured compute, so a neighbour's load on the cores is stretched 39-fold."""
    out = tmp_path_factory.mktemp("reference")
    argv = [sys.executable, "-m", "hetero.trainer.cli", "--model", "debug", "--dataset"]
    argv += ["synthetic", "--global-batch", str(GLOBAL_BATCH), "--steps", str(steps)]
    argv += ["--rebalance-interval", str(INTERVAL), "--lr", "0.05", "--seed", "3"]
    argv += ["--device", "cpu", "--ideal-steps", "0", "--quiet"]
    argv += ["--summary-json", str(out / "summary.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return float(json.loads((out / "summary.json").read_text())["loss_last"])


@pytest.fixture(scope="module")
def reference_loss(tmp_path_factory: pytest.TempPathFactory) -> float:
    return _reference_loss(tmp_path_factory, STEPS)


@pytest.fixture
def rank_kill_reference_loss(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The rank kill's uninterrupted run (``RANK_KILL_STEPS``)."""
    return _reference_loss(tmp_path_factory, RANK_KILL_STEPS)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = _cluster(tmp_path)
    with c:
        yield c
    for name, proc in c.procs.items():
        assert proc.returncode in (0, -signal.SIGKILL), f"{name} exited {proc.returncode}"


def _gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return alive


def _start_and_reach(
    cluster: LocalCluster, tmp_path: Path, step: int, steps: int = STEPS
) -> tuple[str, Timeline]:
    job_id = cluster.submit(_spec(tmp_path, steps))
    _wait_for(
        cluster,
        job_id,
        lambda j: j.last_step >= step and (_ckpt(tmp_path) / "last.pt").is_file(),
        120,
        f"step {step} and a checkpoint",
    )
    return job_id, Timeline()


@pytest.mark.chaos
def test_kill_9_of_an_agent_resumes_the_job_on_the_other_from_its_checkpoint(
    cluster: LocalCluster, tmp_path: Path, reference_loss: float
) -> None:
    job_id, timeline = _start_and_reach(cluster, tmp_path, 100)
    timeline.ranks.update((p.pid, p) for p in _all_ranks(cluster))
    victim_ranks = _ranks(cluster, "node-b")
    assert victim_ranks, "node-b runs a rank"
    step_at_fault = _job(cluster, job_id).last_step
    killed_at = time.time()
    cluster.kill("node-b")
    assert not _gone(victim_ranks, 5.0), "the dead agent's rank died with it (PDEATHSIG)"

    job = _follow(cluster, job_id, timeline, 240)
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.message
    assert job.restarts == 1, job.message
    assert {r.node_name for r in job.ranks} == {"node-a"}, "the lost node is not waited for"
    assert job.world_size == 2, "CPU devices take both ranks: same world size"
    events = _events(cluster)
    down = [t for t, kind, m in events if kind == "node_down" and "node-b" in m]
    assert len(down) == 1
    loss = _final_loss(cluster, job_id)
    assert loss == pytest.approx(reference_loss, rel=LOSS_RTOL)
    rank_processes = _no_orphans(cluster, timeline)
    _record(
        "agent_kill",
        {
            "fault": "kill -9 of the agent of rank 1 (its rank died with it)",
            "step_at_fault": step_at_fault,
            "detect_node_down_s": down[0] - killed_at,
            **_restart_figures(job, timeline, loss, reference_loss, rank_processes),
        },
    )


def test_kill_9_of_a_rank_restarts_the_job_which_completes(
    rank_kill_reference_loss: float, cluster: LocalCluster, tmp_path: Path
) -> None:
    job_id, timeline = _start_and_reach(cluster, tmp_path, 100, RANK_KILL_STEPS)
    timeline.ranks.update((p.pid, p) for p in _all_ranks(cluster))
    (victim,) = _ranks(cluster, "node-b")
    step_at_fault = _job(cluster, job_id).last_step
    victim.send_signal(signal.SIGKILL)

    job = _follow(cluster, job_id, timeline, 240)
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.message
    assert job.restarts == 1
    # Whichever report arrives first names the cause: rank 1's SIGKILL, or rank 0
    # failing at once on its vanished peer.
    assert job.message.startswith("restart 1 of 2: rank "), job.message
    node_b_log = (cluster.root / "node-b.log").read_text()
    assert "rank 1 exited with 137" in node_b_log
    assert {r.node_name for r in job.ranks} == {"node-a", "node-b"}, "both nodes used again"
    loss = _final_loss(cluster, job_id, RANK_KILL_STEPS)
    reference_loss = rank_kill_reference_loss
    assert loss == pytest.approx(reference_loss, rel=LOSS_RTOL)
    rank_processes = _no_orphans(cluster, timeline)
    _record(
        "rank_kill",
        {
            "fault": "kill -9 of rank 1's process",
            "step_at_fault": step_at_fault,
            **_restart_figures(job, timeline, loss, reference_loss, rank_processes),
        },
    )


@pytest.mark.chaos
def test_kill_9_of_the_coordinator_loses_no_rows_and_restarts_nothing(
    cluster: LocalCluster, tmp_path: Path, reference_loss: float
) -> None:
    job_id, timeline = _start_and_reach(cluster, tmp_path, 100)
    ranks = _all_ranks(cluster)
    step_at_fault = _job(cluster, job_id).last_step
    cluster.kill("coordinator")
    outage_s = 6.0  # longer than the heartbeat timeout: no node may be called down for it
    time.sleep(outage_s)
    assert all(p.is_running() for p in ranks), "training goes on without the coordinator"
    cluster.restart_coordinator()

    job = _follow(cluster, job_id, timeline, 240)
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.message
    assert job.restarts == 0, "a coordinator outage restarts nothing"
    assert not [e for e in _events(cluster) if e[1] == "node_down"]
    expected = {(s, r) for s in range(INTERVAL, STEPS + 1, INTERVAL) for r in range(2)}
    deadline = time.monotonic() + 20  # agents deliver their outbox as they reconnect
    while not expected <= (rows := _interval_rows(cluster, job_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    lost = expected - rows
    loss = _final_loss(cluster, job_id)
    assert loss == pytest.approx(reference_loss, rel=LOSS_RTOL)
    during = [s for s, r in rows if s > step_at_fault and r == 0]
    logs = [(cluster.root / f"{n}.log").read_text() for n in ("node-a", "node-b")]
    delivered = [line for text in logs for line in text.splitlines() if "outage over" in line]
    _record(
        "coordinator_kill",
        {
            "fault": f"kill -9 of the coordinator, restarted on the same database after {outage_s:g} s",
            "step_at_fault": step_at_fault,
            "restarts": job.restarts,
            "interval_rows_expected": len(expected),
            "interval_rows_lost": len(lost),
            "agents_outbox": delivered,
            "final_loss": loss,
            "reference_loss": reference_loss,
            "loss_rel_diff": abs(loss - reference_loss) / abs(reference_loss),
        },
    )
    assert not lost, f"interval rows lost: {sorted(lost)}"
    assert during, "rows of intervals run during the outage arrived"
    assert delivered, "an agent delivered its outbox"


@pytest.mark.chaos
def test_a_hung_rank_ends_by_the_collective_timeout_and_the_job_restarts(
    cluster: LocalCluster, tmp_path: Path, reference_loss: float
) -> None:
    """SIGSTOP of a rank: alive, holding its sockets, answering nothing. Its peer's
    collective times out (``collective_timeout_s``), the job restarts, completes."""
    spec = _spec(tmp_path).replace("collective_timeout_s: 30", "collective_timeout_s: 8")
    job_id = cluster.submit(spec)
    _wait_for(
        cluster,
        job_id,
        lambda j: j.last_step >= 100 and (_ckpt(tmp_path) / "last.pt").is_file(),
        120,
        "step 100 and a checkpoint",
    )
    timeline = Timeline()
    timeline.ranks.update((p.pid, p) for p in _all_ranks(cluster))
    (victim,) = _ranks(cluster, "node-b")
    step_at_fault = _job(cluster, job_id).last_step
    victim.send_signal(signal.SIGSTOP)

    job = _follow(cluster, job_id, timeline, 240)
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.message
    assert job.restarts == 1, job.message
    detect = timeline.first(lambda st, r, s: st == pb.JOB_STATE_RESTARTING)
    assert detect is not None and detect < 8 + 15, "ended by the collective timeout, not hung"
    loss = _final_loss(cluster, job_id)
    assert loss == pytest.approx(reference_loss, rel=LOSS_RTOL)
    rank_processes = _no_orphans(cluster, timeline)
    _record(
        "rank_hung",
        {
            "fault": "SIGSTOP of rank 1 (hung peer), collective_timeout_s 8",
            "step_at_fault": step_at_fault,
            **_restart_figures(job, timeline, loss, reference_loss, rank_processes),
            "detect_job_restarting_s": detect,
        },
    )
