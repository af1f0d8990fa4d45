"""Interval reports in a process of their own (``coordinator.reportworker``), through the
real Coordinator API on a SQLite file and on PostgreSQL (``both_stores_url``): the
worker stores each report once and in order and answers the plans the coordinator's
own process would; a report it refuses is refused with the same status; a killed
worker degrades to the coordinator's process with a log line and is replaced; a
restart it causes reaches the admission pass; ``hetero-coord serve`` starts it at the
first report and ends it when it stops, and never shows it a database password."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from handclock import Clock
from servedprocess import START_S, has_database_open, kill_left, serve, still_running, wait_for_line
from sqlalchemy import func, select

from hetero.bench.loadgen import device_profiles
from hetero.coordinator import store, wire
from hetero.coordinator.capacity import CapacityWatch
from hetero.coordinator.database import open_database, read_session_factory, session_factory
from hetero.coordinator.models import IntervalStatRow
from hetero.coordinator.readcache import IntervalHistories, LatestPlans
from hetero.coordinator.recovery import Sweeper
from hetero.coordinator.reportworker import ReportWorker, ReportWorkers
from hetero.coordinator.server import create_server
from hetero.coordinator.service import Deps
from hetero.coordinator.views import HISTORY_FOR_REPORT
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 10.0
#: The password in the PostgreSQL URL ``hetero-coord serve`` is given.
SECRET = "s3cret-of-the-db"
JOB = """\
name: reports
model: debug
global_batch: 32
steps: 100000
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 2
  device: cuda
"""
#: Per-sample seconds of (rank 0, rank 1) in successive intervals: rank 1 slows down,
#: then recovers, so the balancer changes the plan more than once.
SPEEDS = [(0.001, 0.003)] * 4 + [(0.001, 0.006)] * 4 + [(0.001, 0.001)] * 4


@dataclass
class Served:
    stub: pb_grpc.CoordinatorStub
    deps: Deps
    clock: Clock


def _serve(db_url: str, worker: bool, processes: int = 1) -> Iterator[Served]:
    """``server.serve``'s wiring (plan and history caches, a report worker where
    ``worker``) with a hand-moved clock."""
    engine = open_database(db_url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    clock = Clock()
    deps = Deps(
        sessions=sessions,
        readers=readers,
        plans=LatestPlans(readers, ttl_s=60.0),
        histories=IntervalHistories(HISTORY_FOR_REPORT),
        # A generous limit: a loaded test box must not turn a slow report into a fallback.
        reports=ReportWorkers(db_url, processes, timeout_s=60.0) if worker else None,
        clock=clock,
    )
    server, port = create_server("127.0.0.1:0", deps)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(pb_grpc.CoordinatorStub(channel), deps, clock)
    finally:
        channel.close()
        server.stop(0).wait()
        if deps.reports is not None:
            deps.reports.close()
        engine.dispose()


@pytest.fixture
def served(both_stores_url: str) -> Iterator[Served]:
    yield from _serve(both_stores_url, worker=True)


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Served]:
    yield from _serve(f"sqlite:///{tmp_path / 'here.db'}", worker=False)


def _running_job(
    stub: pb_grpc.CoordinatorStub,
    spec: str = JOB,
    devices: list[tpb.DeviceProfile] | None = None,
    name: str = "gpu",
) -> tuple[str, int]:
    """A job of ``spec`` on one node of ``devices`` (two GPUs by default) whose ranks
    run: its id and first plan version."""
    node = stub.RegisterNode(
        pb.RegisterNodeRequest(
            name=name, address=f"{name}.local", devices=devices or device_profiles(2)
        ),
        timeout=DEADLINE_S,
    ).node_id
    job = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S).job
    for r in job.ranks:
        stub.ReportRankStatus(
            pb.ReportRankStatusRequest(
                node_id=node, job_id=job.id, rank=r.rank, state=pb.RANK_STATE_RUNNING
            ),
            timeout=DEADLINE_S,
        )
    return job.id, stub.GetPlan(tpb.GetPlanRequest(job_id=job.id), timeout=DEADLINE_S).version


def _report(
    job_id: str, step: int, version: int, speeds: tuple[float, float]
) -> tpb.IntervalReport:
    report = tpb.IntervalReport(job_id=job_id, end_step=step, plan_version=version)
    for rank, per_sample_s in enumerate(speeds):
        report.ranks.add(rank=rank, batch=16, steps=10, compute_s=16 * per_sample_s, step_s=0.06)
    return report


def _run(served: Served, job_id: str, version: int, start_step: int = 0) -> list[tpb.Plan]:
    """Report :data:`SPEEDS` at the plan each reply gives; the replies."""
    replies = []
    for i, speeds in enumerate(SPEEDS):
        served.clock.now += 1.0
        step = start_step + 10 * (i + 1)
        plan = served.stub.ReportIntervalStats(
            _report(job_id, step, version, speeds), timeout=DEADLINE_S
        ).plan
        replies.append(plan)
        version = plan.version
    return replies


def _rows_per_step(served: Served, job_id: str) -> list[tuple[int, int, float]]:
    """(end step, rows, received at) of the job's stored intervals, in insertion order."""
    t = IntervalStatRow
    with served.deps.sessions() as s:
        return [
            (step, n, at)
            for step, n, at in s.execute(
                select(t.end_step, func.count(), func.max(t.received_at_unix_s))
                .where(t.job_id == job_id)
                .group_by(t.end_step)
                .order_by(func.min(t.id))
            )
        ]


def _worker(served: Served) -> ReportWorker:
    workers = served.deps.reports
    assert workers is not None
    (worker,) = workers.workers
    return worker


def _start_worker(served: Served, job_id: str, version: int) -> None:
    """The first report starts the worker (handled here meanwhile); wait until it is up."""
    served.stub.ReportIntervalStats(_report(job_id, 0, version, (0.001, 0.001)), timeout=DEADLINE_S)
    assert _worker(served).wait_ready(60.0), "the report worker did not start"


def test_reports_in_the_worker_are_stored_once_in_order_and_plan_as_here(
    served: Served, here: Served
) -> None:
    job_id, version = _running_job(served.stub)
    _start_worker(served, job_id, version)
    worker = _worker(served)
    assert worker.pids() and os.getpid() not in worker.pids()
    replies = _run(served, job_id, version)
    assert worker.answered == len(SPEEDS) and worker.fallbacks == 0
    # Each interval once, in the order reported, stamped with the coordinator's clock.
    rows = _rows_per_step(served, job_id)
    assert [(step, n) for step, n, _ in rows] == [(10 * i, 2) for i in range(len(SPEEDS) + 1)]
    assert [at for _, _, at in rows[1:]] == [1_700_000_000.0 + i for i in range(1, len(SPEEDS) + 1)]
    # The plans the coordinator's own process decides for the same reports.
    here_job, here_version = _running_job(here.stub)
    here.stub.ReportIntervalStats(_report(here_job, 0, here_version, (0.001, 0.001)))
    expected = _run(here, here_job, here_version)
    assert [(p.version, list(p.batches)) for p in replies] == [
        (p.version, list(p.batches)) for p in expected
    ]
    assert len({p.version for p in replies}) > 2, "the balancer never changed the plan twice"
    # GetPlan answers the newest plan at once, from the coordinator's cache.
    newest = served.stub.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S)
    assert (newest.version, list(newest.batches)) == (
        replies[-1].version,
        list(replies[-1].batches),
    )


def test_two_workers_take_two_jobs_side_by_side_each_in_its_order(tmp_path: Path) -> None:
    serving = _serve(f"sqlite:///{tmp_path / 'two.db'}", worker=True, processes=2)
    served = next(serving)
    try:
        workers = served.deps.reports
        assert workers is not None and len(workers.workers) == 2
        # Jobs until one lands on each worker (by its id's hash).
        by_worker: dict[int, tuple[str, int]] = {}
        for i in range(32):
            job_id, version = _running_job(served.stub, name=f"gpu{i}")
            by_worker.setdefault(workers.workers.index(workers.of(job_id)), (job_id, version))
            if len(by_worker) == 2:
                break
        assert len(by_worker) == 2, "32 jobs' ids all hashed to one worker"
        for job_id, version in by_worker.values():
            assert workers.of(job_id) is workers.of(job_id)
            served.stub.ReportIntervalStats(
                _report(job_id, 0, version, (0.001, 0.001)), timeout=DEADLINE_S
            )
        assert all(w.wait_ready(60.0) for w in workers.workers), "a worker did not start"
        pids = [w.pids() for w in workers.workers]
        assert all(pids) and len({p for ps in pids for p in ps}) == 2, pids
        with futures.ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(_run, served, j, v) for j, v in by_worker.values()]
            for run in runs:
                assert len(run.result()) == len(SPEEDS)
        for worker in workers.workers:
            assert worker.answered == len(SPEEDS) and worker.fallbacks == 0
        for job_id, _ in by_worker.values():
            steps = [(step, n) for step, n, _ in _rows_per_step(served, job_id)]
            assert steps == [(10 * i, 2) for i in range(len(SPEEDS) + 1)]
    finally:
        serving.close()


def test_a_report_the_worker_refuses_is_refused_as_here_and_stores_nothing(served: Served) -> None:
    job_id, version = _running_job(served.stub)
    _start_worker(served, job_id, version)
    bad = tpb.IntervalReport(job_id=job_id, end_step=10, plan_version=version)
    bad.ranks.add(rank=0, batch=16, steps=10, compute_s=0.01, step_s=0.06)
    with pytest.raises(grpc.RpcError) as info:
        served.stub.ReportIntervalStats(bad, timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "report has ranks [0], want 0..1" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        served.stub.ReportIntervalStats(_report("nope", 10, 1, (0.001, 0.001)), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert _worker(served).answered == 2 and _worker(served).fallbacks == 0
    assert [step for step, _, _ in _rows_per_step(served, job_id)] == [0]


def test_a_killed_worker_degrades_to_the_coordinator_with_a_log_line_and_is_replaced(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    job_id, version = _running_job(served.stub)
    _start_worker(served, job_id, version)
    worker = _worker(served)
    (pid,) = worker.pids()
    os.kill(pid, signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="hetero.coordinator"):
        plan = served.stub.ReportIntervalStats(
            _report(job_id, 10, version, (0.001, 0.001)), timeout=DEADLINE_S
        ).plan
    assert plan.version >= version
    assert worker.fallbacks == 1
    assert "the report worker process stopped; replacing it, working here" in caplog.text
    # The next report starts another worker (handled here meanwhile), which takes the
    # reports after it; every interval is stored once.
    served.stub.ReportIntervalStats(
        _report(job_id, 20, version, (0.001, 0.001)), timeout=DEADLINE_S
    )
    assert worker.wait_ready(60.0)
    assert worker.pids() and pid not in worker.pids()
    answered = worker.answered
    served.stub.ReportIntervalStats(
        _report(job_id, 30, version, (0.001, 0.001)), timeout=DEADLINE_S
    )
    assert worker.answered == answered + 1 and worker.fallbacks == 1
    assert [(step, n) for step, n, _ in _rows_per_step(served, job_id)] == [
        (0, 2),
        (10, 2),
        (20, 2),
        (30, 2),
    ]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_hetero_coord_serve_starts_its_report_worker_at_the_first_report_and_ends_it(
    tmp_path: Path, both_stores_url: str, stop: signal.Signals
) -> None:
    """SIGTERM: the coordinator stops its worker as it stops. ``kill -9``: the worker
    sees its parent gone and exits (``workerprocess._exit_with_parent``). On PostgreSQL
    the URL has a password (the test server ignores it), which neither the log nor a
    child's command line or environment shows."""
    on_sqlite = both_stores_url.startswith("sqlite")
    db = () if on_sqlite else ("--db", both_stores_url.replace("postgres@", f"postgres:{SECRET}@"))
    proc, log = serve(tmp_path, *db, "--insecure")
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_S
        bound = wait_for_line(proc, log, r"listening on \S+ \(port (\d+)")
        coordinator = psutil.Process(proc.pid)
        with grpc.insecure_channel(f"127.0.0.1:{bound.group(1)}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            job_id, version = _running_job(stub)
            assert not coordinator.children(), "a worker started before any report"
            step, answered = 0, False
            while not answered:  # until a report's reply says it was handled there
                assert time.monotonic() < deadline + 60, "no report worker started"
                step += 10
                stub.ReportIntervalStats(
                    _report(job_id, step, version, (0.001, 0.001)), timeout=DEADLINE_S
                )
                # The worker (and multiprocessing's resource tracker, where it runs one).
                children = coordinator.children()
                answered = any(has_database_open(c, on_sqlite) for c in children)
                time.sleep(0.2)
        for child in children:
            assert SECRET not in " ".join(child.cmdline())
            assert SECRET not in str(child.environ())
        proc.send_signal(stop)
        code = proc.wait(timeout=30)
        alive = still_running(children, timeout_s=30)
        assert not alive, f"left behind by the coordinator: {alive}"
        if stop == signal.SIGTERM:
            assert code == 0, log.read_text()[-4000:]
            assert "coordinator stopped" in log.read_text()
            assert "Traceback" not in log.read_text()
        assert SECRET not in log.read_text()
    finally:
        kill_left(proc, children)


SHED = """\
name: shed
model: debug
global_batch: 16
steps: 400
rebalance_interval: 4
max_restarts: 1
emulate_slowdown: {1: 8}
checkpoint: {dir: /tmp/ckpt, interval_steps: 4}
resources: {ranks: 2, device: cpu}
"""


def test_a_restart_the_worker_causes_tells_the_admission_pass(served: Served) -> None:
    """A job the worker restarts without its slow rank (``exclusion``): the
    coordinator's sessions never saw that write, so the report's reply tells the
    sweeper's capacity watch, and the next sweep runs an admission pass."""
    capacity = CapacityWatch(served.deps.sessions)
    object.__setattr__(served.deps, "capacity", capacity)
    cpu = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    stub = served.stub
    job_id, _ = _running_job(stub, SHED, [cpu], "cpu")
    plan = stub.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S)
    _start_worker(served, job_id, plan.version)
    epoch = capacity.due(served.clock())
    assert epoch is not None
    capacity.passed(epoch, served.clock())
    state, step = pb.JOB_STATE_RUNNING, 0
    while state == pb.JOB_STATE_RUNNING and step < 200:
        step += 4
        # Rank 1 is 8x slower on a step with a fixed cost: the job is faster without it.
        compute = [(0.0002 * b + 0.004) * f for b, f in zip(plan.batches, (1, 8), strict=True)]
        report = tpb.IntervalReport(job_id=job_id, end_step=step, plan_version=plan.version)
        for rank, (b, t) in enumerate(zip(plan.batches, compute, strict=True)):
            report.ranks.add(rank=rank, batch=b, steps=4, compute_s=t, step_s=max(compute) + 0.003)
        plan = stub.ReportIntervalStats(report, timeout=DEADLINE_S).plan
        state = stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S).state
    assert state == pb.JOB_STATE_RESTARTING, "the worker never left the slow rank out"
    assert _worker(served).fallbacks == 0
    assert capacity.due(served.clock()) is not None, "the sweeper was not told"


def test_the_sweepers_admission_pass_runs_in_the_worker_once_it_runs(served: Served) -> None:
    """With 10,000 jobs queued a pass is about 0.1 s of CPU: in a worker it holds no lock
    of the coordinator's interpreter. A job that fits once a node is added behind the
    admission pass's back is placed by the sweeper's next pass, in the worker."""
    stub, deps = served.stub, served.deps
    job_id, version = _running_job(stub)
    _start_worker(served, job_id, version)
    waiting = stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=JOB.replace("name: reports", "name: waits")),
        timeout=DEADLINE_S,
    ).job
    assert waiting.state == pb.JOB_STATE_QUEUED
    with deps.sessions.begin() as s:  # devices that no pass has seen yet
        devices = [wire.device_row(d) for d in device_profiles(2)]
        store.register_node(
            s,
            name="late",
            address="late.local",
            agent_endpoint="",
            agent_version="",
            devices=devices,
            now=served.clock(),
        )
    workers = deps.reports
    assert workers is not None
    before = _worker(served).answered
    changed: list[bool] = []
    sweeper = Sweeper(
        deps.sessions,
        deps.sweep_config(),
        period_s=3600.0,
        clock=served.clock,
        on_change=lambda: changed.append(True),
        capacity=CapacityWatch(deps.sessions),
        admit_elsewhere=workers.admit,
    )
    try:
        sweeper.sweep_once()
    finally:
        sweeper.capacity.close()
    placed = stub.GetJob(pb.GetJobRequest(job_id=waiting.id), timeout=DEADLINE_S)
    assert placed.state != pb.JOB_STATE_QUEUED, placed.message
    assert _worker(served).answered == before + 1, "the pass did not run in the worker"
    assert changed == [True], "the coordinator's caches were not dropped after a placement"
