"""The coordinator restarts a job without a rank it is forecast faster without.

Real parts: ``hetero-coord serve`` on a loopback port with SQLite under tmp_path,
one ``hetero-agent run``, Gloo ranks it launches. Rank 1 is EMULATED 32x slower
(the spec's ``emulate_slowdown``): the debug model's fixed per-step cost,
multiplied by 32 on rank 1 even at one sample, makes the measured forecast say
the job is several times faster on rank 0 alone, and the job is long enough
(1,500 steps) that the time saved exceeds a restart's measured start-up many
times over. The built-in job (``allow_exclusion`` on by default) is restarted
from its checkpoint on one rank, its event names the forecast and the restart's
balance, and it succeeds. What is not allowed (a ``command:`` job, a job with
no checkpoint) is pinned through the API in ``test_exclusion_api.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.core.states import JobState
from hetero.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.slow

BUILTIN = """\
name: shed
model: debug
global_batch: 16
steps: 1500
policy: dynamic
rebalance_interval: 4
emulate_slowdown: {{1: 32}}
checkpoint: {{dir: {ckpt}, interval_steps: 4}}
resources: {{ranks: 2, device: cpu}}
"""


def test_a_built_in_job_restarts_from_its_checkpoint_without_its_slow_rank(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cluster"
    with LocalCluster(root, [AgentSpec("node")]) as cluster:
        shed = cluster.submit(BUILTIN.format(ckpt=cluster.job_files / "ckpt"))
        job = cluster.wait(shed, timeout_s=120)
        detail = cluster.stub.GetJob(pb.GetJobRequest(job_id=shed), timeout=10)
    assert JobState(job.state) is JobState.SUCCEEDED, job.message
    assert job.world_size == 1, "the job finished on one rank"

    excluded = [e.message for e in detail.events if e.kind == "rank_excluded"]
    assert len(excluded) == 1, [e.message for e in detail.events]
    message = excluded[0]
    assert "rank 1" in message and "emulated x32" in message
    assert "would raise predicted throughput by" in message and "samples/s" in message
    assert "no all-reduce with one rank" in message
    assert "steps left that saves" in message and "start-up measured" in message
    assert any(e.kind == "job_restarted" and "1 ranks" in e.message for e in detail.events)

    db = sqlite3.connect(root / "coordinator" / "coordinator.db")
    restarts, exclusion_restarts = db.execute(
        "SELECT restarts, exclusion_restarts FROM jobs WHERE id = ?", (shed,)
    ).fetchone()
    assert (restarts, exclusion_restarts) == (1, 1), "one restart, the exclusion's"
    resumed = db.execute(
        "SELECT MIN(end_step) FROM interval_stats WHERE job_id = ? AND plan_version >= "
        "(SELECT attempt_first_plan FROM jobs WHERE id = ?)",
        (shed, shed),
    ).fetchone()[0]
    assert resumed is not None and resumed > 4, "the one-rank attempt resumed from a checkpoint"
