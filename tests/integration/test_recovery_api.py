"""Recovery through the real Coordinator API (gRPC on port 0, SQLite under tmp_path,
then PostgreSQL).

The test plays the agents' part with the same RPCs they use, and moves the
clock by hand, so detection and restart are pinned without waiting: a silent
node is marked down once (and up again), a failed rank or lost node restarts
the job on the healthy devices with a new attempt, port and plan, old
attempts' news changes nothing, and exhausted restarts fail the job.
"""

from __future__ import annotations

import grpc
import pytest
from simcluster import watch_orders
from sqlalchemy import text

from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
JOB = """\
name: chaos
model: debug
global_batch: 24
steps: 100
rebalance_interval: 5
max_restarts: {restarts}
checkpoint: {{dir: /tmp/ckpt, interval_steps: 10}}
resources: {{ranks: 2, device: {device}}}
"""


@pytest.fixture
def db_url(both_stores_url: str) -> str:
    return both_stores_url


def _register(c, name: str, kind: int = tpb.DEVICE_KIND_CPU) -> str:  # type: ignore[no-untyped-def]
    device = tpb.DeviceProfile(index=0, name=f"{name}-dev", kind=kind, compute_score=1.0)
    req = pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=[device])
    return str(c.stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _beat(c, node_id: str) -> None:  # type: ignore[no-untyped-def]
    c.stub.Heartbeat(pb.HeartbeatRequest(node_id=node_id), timeout=DEADLINE_S)


def _poll(c, node_id: str) -> pb.Orders:  # type: ignore[no-untyped-def]
    return watch_orders(c.stub, node_id)


def _report(c, node_id, job_id, rank, state, code=None, attempt=0, message=""):  # type: ignore[no-untyped-def]
    req = pb.ReportRankStatusRequest(
        node_id=node_id, job_id=job_id, rank=rank, state=state, attempt=attempt, message=message
    )
    if code is not None:
        req.exit_code = code
    return c.stub.ReportRankStatus(req, timeout=DEADLINE_S)


def _job(c, job_id: str) -> pb.Job:  # type: ignore[no-untyped-def]
    return c.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)


def _sweep(c) -> None:  # type: ignore[no-untyped-def]
    c.sweep()


def _events(c, kind: str) -> list[str]:  # type: ignore[no-untyped-def]
    c.flush()
    with c.engine.connect() as db:
        rows = db.execute(
            text("SELECT message FROM events WHERE kind = :kind ORDER BY id"), {"kind": kind}
        )
        return [m for (m,) in rows.all()]


def _start(c, job_id: str, nodes: dict[str, str], attempt: int = 0) -> dict[int, str]:  # type: ignore[no-untyped-def]
    """Every node launches what it is told; returns rank -> node id."""
    where = {}
    for node_id in nodes.values():
        for order in _poll(c, node_id).launches:
            assert order.attempt == attempt
            _report(c, node_id, job_id, order.rank, pb.RANK_STATE_RUNNING, attempt=attempt)
            where[order.rank] = node_id
    return where


def _submit(c, restarts: int = 1, device: str = "cpu") -> str:  # type: ignore[no-untyped-def]
    spec = JOB.format(restarts=restarts, device=device)
    return str(c.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S).job_id)


def test_a_silent_node_is_marked_down_once_and_up_again_when_it_heartbeats(coordinator) -> None:  # type: ignore[no-untyped-def]
    a, b = _register(coordinator, "node-a"), _register(coordinator, "node-b")
    coordinator.clock.now += 6.0
    _beat(coordinator, a)
    coordinator.clock.now += 6.0  # b silent 12 s > 10 s timeout; a silent 6 s
    for _ in range(3):
        _sweep(coordinator)
        coordinator.clock.now += 1.0
    assert _events(coordinator, "node_down") == ["node node-b down: silent for 12.0 s"]
    _beat(coordinator, b)
    _sweep(coordinator)
    assert _events(coordinator, "node_up") == ["node node-b is back"]
    assert len(_events(coordinator, "node_down")) == 1


def test_a_restarted_coordinator_counts_silence_from_its_own_start(coordinator) -> None:  # type: ignore[no-untyped-def]
    _register(coordinator, "node-a")
    coordinator.clock.now += 100.0  # the coordinator was down for 100 s, then started
    coordinator.restart()
    coordinator.clock.now += 5.0
    coordinator.sweep()
    assert _events(coordinator, "node_down") == [], "agents get the timeout to come back"


def test_a_failed_rank_restarts_the_job_with_a_new_attempt_port_and_resume(coordinator) -> None:  # type: ignore[no-untyped-def]
    nodes = {"a": _register(coordinator, "node-a"), "b": _register(coordinator, "node-b")}
    job_id = _submit(coordinator, restarts=1)
    first = _job(coordinator, job_id)
    where = _start(coordinator, job_id, nodes)
    assert _job(coordinator, job_id).state == pb.JOB_STATE_RUNNING

    resp = _report(coordinator, where[1], job_id, 1, pb.RANK_STATE_EXITED, 137, message="killed")
    assert resp.job_state == pb.JOB_STATE_RESTARTING
    job = _job(coordinator, job_id)
    assert job.restarts == 0, "counted once the restart is placed"
    assert job.message == "restart 1 of 1: rank 1 exited with code 137 (killed)"
    (stop,) = _poll(coordinator, where[0]).stops
    assert (stop.rank, stop.attempt) == (0, 0), "the survivor is stopped"
    assert _poll(coordinator, where[1]).launches == [], "nothing starts before the old ranks end"

    # Rank 0's own failure (its peer vanished) is a confirmation, not a second restart.
    _report(coordinator, where[0], job_id, 0, pb.RANK_STATE_EXITED, 1)
    job = _job(coordinator, job_id)
    assert job.state == pb.JOB_STATE_PENDING and job.restarts == 1
    assert job.master_port != first.master_port, "a fresh rendezvous port per attempt"
    assert job.plan.version > first.plan.version and sum(job.plan.batches) == 24
    orders = [o for n in nodes.values() for o in _poll(coordinator, n).launches]
    assert sorted(o.rank for o in orders) == [0, 1]
    assert all(o.attempt == 1 and o.args.resume for o in orders)
    assert all(o.collective_timeout_s == 60.0 for o in orders)

    # News of attempt 0 arriving late changes nothing.
    _report(coordinator, where[1], job_id, 1, pb.RANK_STATE_EXITED, 1, attempt=0)
    assert _job(coordinator, job_id).state == pb.JOB_STATE_PENDING
    assert [e.kind for e in _job(coordinator, job_id).events].count("job_restarted") == 1


def test_a_lost_cuda_node_restarts_the_job_on_fewer_ranks_without_waiting(coordinator) -> None:  # type: ignore[no-untyped-def]
    cuda = tpb.DEVICE_KIND_CUDA
    nodes = {"a": _register(coordinator, "gpu-a", cuda), "b": _register(coordinator, "gpu-b", cuda)}
    job_id = _submit(coordinator, restarts=2, device="cuda")
    where = _start(coordinator, job_id, nodes)
    coordinator.clock.now += 8.0
    _beat(coordinator, nodes["a"])
    coordinator.clock.now += 4.0  # gpu-b silent for 12 s
    _sweep(coordinator)
    job = _job(coordinator, job_id)
    assert job.state == pb.JOB_STATE_RESTARTING
    assert "node gpu-b went down (rank 1)" in job.message
    lost = next(r for r in job.ranks if r.node_name == "gpu-b")
    assert lost.state == pb.RANK_STATE_EXITED, "the lost node's rank is gone at once"

    _report(coordinator, where[0], job_id, 0, pb.RANK_STATE_EXITED, 143)
    job = _job(coordinator, job_id)
    assert job.state == pb.JOB_STATE_PENDING and job.world_size == 1
    assert [r.node_name for r in job.ranks] == ["gpu-a"]
    assert list(job.plan.batches) == [24], "same global batch on fewer ranks"
    (order,) = _poll(coordinator, nodes["a"]).launches
    assert order.world_size == 1 and order.rank == 0

    _beat(coordinator, nodes["b"])  # it comes back: used at the next restart
    _report(coordinator, nodes["a"], job_id, 0, pb.RANK_STATE_RUNNING, attempt=1)
    _report(coordinator, nodes["a"], job_id, 0, pb.RANK_STATE_EXITED, 1, attempt=1)
    job = _job(coordinator, job_id)
    assert job.world_size == 2 and job.restarts == 2
    assert sorted(r.node_name for r in job.ranks) == ["gpu-a", "gpu-b"]


def test_restarts_exhausted_fail_the_job_and_stop_the_survivors(coordinator) -> None:  # type: ignore[no-untyped-def]
    nodes = {"a": _register(coordinator, "node-a"), "b": _register(coordinator, "node-b")}
    job_id = _submit(coordinator, restarts=0)
    where = _start(coordinator, job_id, nodes)
    resp = _report(coordinator, where[1], job_id, 1, pb.RANK_STATE_EXITED, 1)
    assert resp.job_state == pb.JOB_STATE_FAILED
    assert _job(coordinator, job_id).message == "rank 1 exited with code 1"
    assert [s.rank for s in _poll(coordinator, where[0]).stops] == [0]


def test_a_restart_that_fits_nowhere_waits_with_the_reason_and_resumes_when_a_node_returns(  # type: ignore[no-untyped-def]
    coordinator,
) -> None:
    cuda = tpb.DEVICE_KIND_CUDA
    nodes = {"a": _register(coordinator, "gpu-a", cuda), "b": _register(coordinator, "gpu-b", cuda)}
    job_id = _submit(coordinator, restarts=3, device="cuda")
    _start(coordinator, job_id, nodes)
    coordinator.clock.now += 11.0  # both nodes silent
    _sweep(coordinator)
    _sweep(coordinator)  # a second pass changes nothing: one event, the same reason
    job = _job(coordinator, job_id)
    assert job.state == pb.JOB_STATE_RESTARTING and job.restarts == 0
    assert job.message == "restart waiting for 1 CUDA device; none free; down: gpu-a, gpu-b"
    assert [e.kind for e in job.events].count("job_restart_waiting") == 1

    coordinator.clock.now += 30.0
    _beat(coordinator, nodes["a"])
    _sweep(coordinator)
    job = _job(coordinator, job_id)
    assert job.state == pb.JOB_STATE_PENDING and job.restarts == 1 and job.world_size == 1
    assert job.message == "restarted after waiting 30 s for devices"
    (order,) = _poll(coordinator, nodes["a"]).launches
    assert order.attempt == 1 and order.args.resume


def test_a_waiting_restart_goes_before_the_queue_on_the_devices_that_free(coordinator) -> None:  # type: ignore[no-untyped-def]
    cuda = tpb.DEVICE_KIND_CUDA
    nodes = {n: _register(coordinator, f"gpu-{n}", cuda) for n in "abc"}
    job_id = _submit(coordinator, restarts=1, device="cuda")
    _start(coordinator, job_id, {n: nodes[n] for n in "ab"})
    other = "name: other\nglobal_batch: 8\nsteps: 5\nresources: {ranks: 1, device: cuda}\n"
    later = other.replace("other", "later")
    other_id = coordinator.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=other)).job_id
    coordinator.clock.now += 1.0
    later_job = coordinator.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=later)).job
    assert later_job.state == pb.JOB_STATE_QUEUED
    coordinator.clock.now += 11.0
    _beat(coordinator, nodes["c"])  # gpu-a and gpu-b silent
    _sweep(coordinator)
    assert _job(coordinator, job_id).state == pb.JOB_STATE_RESTARTING

    coordinator.stub.CancelJob(pb.CancelJobRequest(job_id=other_id), timeout=DEADLINE_S)
    assert _job(coordinator, later_job.id).state == pb.JOB_STATE_QUEUED, "gpu-c is held"
    _report(coordinator, nodes["c"], other_id, 0, pb.RANK_STATE_EXITED, 143)
    _sweep(coordinator)
    job = _job(coordinator, job_id)
    assert job.state == pb.JOB_STATE_PENDING and [r.node_name for r in job.ranks] == ["gpu-c"]
    assert job.restarts == 1, "one restart, however long it waited"
    assert _job(coordinator, later_job.id).state == pb.JOB_STATE_QUEUED


def test_a_restart_that_can_never_fit_fails_in_one_line(coordinator) -> None:  # type: ignore[no-untyped-def]
    cuda = tpb.DEVICE_KIND_CUDA
    nodes = {"a": _register(coordinator, "gpu-a", cuda), "b": _register(coordinator, "gpu-b", cuda)}
    job_id = _submit(coordinator, restarts=3, device="cuda")
    _start(coordinator, job_id, nodes)
    coordinator.clock.now += 11.0
    _sweep(coordinator)
    for name in ("gpu-a", "gpu-b"):  # both come back without their GPU
        _register(coordinator, name, tpb.DEVICE_KIND_CPU)
    _sweep(coordinator)
    job = _job(coordinator, job_id)
    assert job.state == pb.JOB_STATE_FAILED
    assert job.message == (
        "cannot restart: job 'chaos' needs 1 ranks, more than the 0 registered CUDA devices "
        "can ever hold (0): it would wait for ever"
    )


def test_buffered_telemetry_lands_in_the_bucket_it_was_sampled_in(coordinator) -> None:  # type: ignore[no-untyped-def]
    node_id = _register(coordinator, "node-a")
    sampled = coordinator.clock.now - 120.0
    late = pb.HeartbeatRequest(
        node_id=node_id, host=tpb.HostTelemetry(cpu_percent=7.0), sampled_at_unix_s=sampled
    )
    coordinator.stub.Heartbeat(late, timeout=DEADLINE_S)
    coordinator.flush()  # a heartbeat's writes are not waited for
    with coordinator.engine.connect() as db:
        rows = db.execute(text("SELECT time_unix_s, cpu_percent FROM telemetry")).all()
    assert [tuple(r) for r in rows] == [(sampled, 7.0)]


def test_a_report_of_an_earlier_attempt_is_kept_but_never_replans(coordinator) -> None:  # type: ignore[no-untyped-def]
    nodes = {"a": _register(coordinator, "node-a"), "b": _register(coordinator, "node-b")}
    job_id = _submit(coordinator, restarts=1)
    where = _start(coordinator, job_id, nodes)
    _report(coordinator, where[1], job_id, 1, pb.RANK_STATE_EXITED, 1)
    _report(coordinator, where[0], job_id, 0, pb.RANK_STATE_EXITED, 1)
    before = _job(coordinator, job_id).plan.version
    stats = [
        tpb.RankIntervalStats(rank=r, batch=12, steps=5, compute_s=0.1 * (r + 1), step_s=0.3)
        for r in range(2)
    ]
    old = tpb.IntervalReport(job_id=job_id, end_step=20, plan_version=1, ranks=stats)
    resp = coordinator.stub.ReportIntervalStats(old, timeout=DEADLINE_S)
    assert resp.plan.version == before, "a stale attempt's report does not re-plan"
    with pytest.raises(grpc.RpcError):
        bad = tpb.IntervalReport(job_id=job_id, end_step=20, plan_version=1, ranks=stats[:1])
        coordinator.stub.ReportIntervalStats(bad, timeout=DEADLINE_S)


def test_a_coordinator_restarted_on_its_database_carries_on_where_it_stopped(  # type: ignore[no-untyped-def]
    coordinator,
) -> None:
    """A second coordinator process on the same database (SQLite file or PostgreSQL
    database), started 100 s later: it finds the nodes and the running job, gives
    the agents their timeout before marking anything down, and restarts the job
    from where the first one left it."""
    nodes = {"a": _register(coordinator, "node-a"), "b": _register(coordinator, "node-b")}
    job_id = _submit(coordinator, restarts=1)
    where = _start(coordinator, job_id, nodes)
    before = _job(coordinator, job_id)
    coordinator.clock.now += 100.0
    coordinator.restart()
    again = coordinator
    job = _job(again, job_id)
    assert job.state == pb.JOB_STATE_RUNNING
    assert (job.plan.version, list(job.plan.batches)) == (
        before.plan.version,
        list(before.plan.batches),
    )
    _sweep(again)
    assert _events(again, "node_down") == [], "agents get the timeout to come back"
    for node_id in nodes.values():
        _beat(again, node_id)
    resp = _report(again, where[1], job_id, 1, pb.RANK_STATE_EXITED, 1)
    assert resp.job_state == pb.JOB_STATE_RESTARTING
    _report(again, where[0], job_id, 0, pb.RANK_STATE_EXITED, 1)
    orders = [o for n in nodes.values() for o in _poll(again, n).launches]
    assert sorted(o.rank for o in orders) == [0, 1]
    assert all(o.attempt == 1 and o.args.resume for o in orders)
