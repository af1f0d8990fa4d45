"""A node back from down reconciles (issue #33): its agent stops every rank the
coordinator no longer wants there, and no job runs twice.

An agent stopped with SIGSTOP past the heartbeat timeout is declared down; its ranks
run on meanwhile (each leads a session of its own). The coordinator counts them gone:
one job moves to another node (a restart), one fails (no restart left), one is
cancelled. None of them gets a stop order for the lost node. After SIGCONT the
agent's order stream delivers the node's wanted ranks, which hold none of them: within
10 s no process of those jobs is left on the node, and the moved job runs once, on
the other node. And a CUDA device runs one rank at a time: a launch there waits
until the rank being stopped on it is gone."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from hetero.agent.config import AgentConfig
from hetero.agent.local import PlanCache
from hetero.agent.outbox import Outbox
from hetero.agent.reconcile import Reconciler
from hetero.agent.shipper import Shipper
from hetero.agent.supervisor import Supervisor
from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
#: Seconds a node back from down may keep ranks it should not run (the issue's target).
RECONCILED_S = 10.0

SLEEPER = """\
name: {name}
command: ["{python}", "-c", "import time; time.sleep(600)"]
global_batch: 8
steps: 10
max_restarts: {restarts}
resources: {{ranks: 1, device: cpu, nodes: [{nodes}]}}
"""


def _ranks_of(cluster: LocalCluster, node: str) -> dict[str, set[int]]:
    """The rank processes an agent runs: job id -> attempts."""
    found: dict[str, set[int]] = {}
    for proc in psutil.Process(cluster.procs[node].pid).children(recursive=True):
        try:
            env = proc.environ()
        except psutil.Error:
            continue  # ended meanwhile
        if "HETERO_JOB_ID" in env:
            found.setdefault(env["HETERO_JOB_ID"], set()).add(int(env["HETERO_ATTEMPT"]))
    return found


def _until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.2)


def test_a_node_back_from_down_stops_the_ranks_of_jobs_that_moved_failed_or_were_cancelled(
    tmp_path: Path,
) -> None:
    with LocalCluster(
        tmp_path / "cluster",
        [AgentSpec("node-a")],
        heartbeat_timeout_s=TIMEOUT_S,
        heartbeat_interval_s=0.5,
    ) as cluster:

        def job(job_id: str) -> pb.Job:
            return cluster.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=10)

        def submit(name: str, restarts: int, nodes: str) -> str:
            spec = SLEEPER.format(name=name, python=sys.executable, restarts=restarts, nodes=nodes)
            return cluster.submit(spec)

        moves = submit("moves", 1, "node-a, node-b")
        fails = submit("fails", 0, "node-a")
        cancelled = submit("cancelled", 1, "node-a")
        _until(
            "three ranks run on node-a",
            lambda: set(_ranks_of(cluster, "node-a")) == {moves, fails, cancelled},
            60,
        )
        cluster.start_agent(AgentSpec("node-b"))  # after: the first placement is node-a's
        cluster.wait_for_nodes({"node-b"}, 60)

        cluster.procs["node-a"].send_signal(signal.SIGSTOP)
        try:
            _until(
                "the moved job runs on node-b",
                lambda: _ranks_of(cluster, "node-b").get(moves) == {1},
                60,
            )
            assert job(fails).state == pb.JOB_STATE_FAILED, job(fails).message
            assert job(cancelled).state == pb.JOB_STATE_RESTARTING
            cluster.stub.CancelJob(pb.CancelJobRequest(job_id=cancelled), timeout=10)
            stale = _ranks_of(cluster, "node-a")
            assert stale == {moves: {0}, fails: {0}, cancelled: {0}}, "ranks ran on meanwhile"
        finally:
            cluster.procs["node-a"].send_signal(signal.SIGCONT)
        back = time.monotonic()
        _until(
            "node-a runs no rank of those jobs",
            lambda: not _ranks_of(cluster, "node-a"),
            RECONCILED_S,
        )
        took = time.monotonic() - back
        assert _ranks_of(cluster, "node-b") == {moves: {1}}, "the moved job runs once"
        moved = job(moves)
        assert moved.state == pb.JOB_STATE_RUNNING and moved.restarts == 1
        assert [r.node_name for r in moved.ranks] == ["node-b"]
        log = (tmp_path / "cluster" / "node-a.log").read_text()
    assert "is no longer wanted on this node" in log, log[-2000:]
    print(f"node-a's stale ranks ended {took:.2f} s after SIGCONT")


#: A rank that takes a while to stop: after SIGTERM it exits 0 once the file ``{release}``
#: exists (the test says when, rather than a delay a loaded host could outlast).
SLOW_TO_STOP = """\
import os, signal, sys, time
def stop(*_):
    while not os.path.exists({release!r}):
        time.sleep(0.05)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(600)
"""


def _texts(supervisor: Supervisor) -> list[str]:
    return [line.text for line in supervisor.take_lines()]


def _on_cuda0(job_id: str, code: str) -> pb.Orders:
    """A burst that launches ``job_id``'s one rank on cuda:0 and wants only it."""
    launch = pb.RankLaunch(
        job_id=job_id,
        rank=0,
        world_size=1,
        device_kind=tpb.DEVICE_KIND_CUDA,
        device_index=0,
        args=pb.TrainingArgs(command=[sys.executable, "-c", code]),
    )
    wanted = pb.NodeRanks(ranks=[pb.RankRef(job_id=job_id, rank=0, attempt=0)])
    return pb.Orders(launches=[launch], complete=True, wanted=wanted)


def test_a_launch_on_a_cuda_device_waits_until_the_rank_stopped_there_is_gone(
    tmp_path: Path,
) -> None:
    config = AgentConfig(state_dir=tmp_path, stop_grace_s=30.0)
    supervisor = Supervisor(tmp_path)
    plans = PlanCache()
    link = SimpleNamespace(node_id="node-a")  # the shipper only names the node
    shipper = Shipper(config, link, supervisor, plans, Outbox())  # type: ignore[arg-type]
    reconciler = Reconciler(
        config, supervisor, plans, shipper, endpoint="127.0.0.1:1", job_tokens=None
    )
    try:
        release = tmp_path / "release"
        reconciler.carry_out(_on_cuda0("old", SLOW_TO_STOP.format(release=str(release))))
        _until("the old rank is ready", lambda: "ready" in _texts(supervisor), 30)
        old = supervisor.workers[("old", 0)].proc

        reconciler.carry_out(_on_cuda0("new", "import time; time.sleep(600)"))
        assert supervisor.workers[("old", 0)].stopping, "not wanted any more: stopped"
        assert ("new", 0) not in supervisor.workers, "cuda:0 is still held"
        reconciler.reap()
        assert old.poll() is None and ("new", 0) not in supervisor.workers, "still held"
        release.touch()  # the old rank ends
        deadline = time.monotonic() + 30
        while ("new", 0) not in supervisor.workers:
            assert time.monotonic() < deadline, "the new rank never started"
            time.sleep(0.05)
            reconciler.reap()
        assert old.poll() == 0, "the new rank started only once the old one had ended"
    finally:
        supervisor.stop_all(1.0)
