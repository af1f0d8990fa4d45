"""The job queue over real gRPC and a real SQLite file: jobs wait for busy devices with a
reason, in priority then submission order, are placed as devices free up (at once, or by
the sweeper's pass), can be cancelled while they wait; a job that can never fit is
refused in one line; limits answer RESOURCE_EXHAUSTED."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import grpc
import pytest
from simcluster import watch_orders

from hetero.coordinator.admission import Limits
from hetero.coordinator.service import REFRESH_S
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0


def _spec(name: str, ranks: int, priority: int | None = None) -> str:
    text = (
        f"name: {name}\nglobal_batch: 32\nsteps: 10\nresources:\n  ranks: {ranks}\n  device: cpu\n"
    )
    return text + (f"priority: {priority}\n" if priority is not None else "")


def _node(coordinator, name: str = "n1") -> str:  # type: ignore[no-untyped-def]
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    request = pb.RegisterNodeRequest(
        name=name, address=f"{name}.local", agent_endpoint=f"{name}.local:7071", devices=[device]
    )
    return str(coordinator.stub.RegisterNode(request, timeout=DEADLINE_S).node_id)


def _submit(coordinator, spec: str, **kw: object) -> pb.Job:  # type: ignore[no-untyped-def]
    coordinator.clock.now += 0.5  # FIFO is by submission time: each its own
    request = pb.SubmitJobRequest(spec_yaml=spec, **kw)  # type: ignore[arg-type]
    return coordinator.stub.SubmitJob(request, timeout=DEADLINE_S).job


def _get(coordinator, job_id: str) -> pb.Job:  # type: ignore[no-untyped-def]
    return coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)


def _finish(coordinator, job: pb.Job) -> None:  # type: ignore[no-untyped-def]
    for r in job.ranks:
        coordinator.stub.ReportRankStatus(
            pb.ReportRankStatusRequest(
                node_id=r.node_id,
                job_id=job.id,
                rank=r.rank,
                state=pb.RANK_STATE_EXITED,
                exit_code=0,
            ),
            timeout=DEADLINE_S,
        )
    coordinator.flush()  # the queue's pass the freed devices asked for, run now


@pytest.fixture
def small(coordinator):  # type: ignore[no-untyped-def]
    """The coordinator with 4 ranks a CPU device, and one node of one CPU device."""
    coordinator.reconfigure(limits=Limits(ranks_per_cpu_device=4))
    _node(coordinator)
    return coordinator


def test_a_job_waits_queued_with_its_reason_and_runs_when_devices_free_up(small) -> None:  # type: ignore[no-untyped-def]
    first = _submit(small, _spec("first", 3))
    assert first.state == pb.JOB_STATE_PENDING and len(first.ranks) == 3
    second = _submit(small, _spec("second", 2))
    assert second.state == pb.JOB_STATE_QUEUED and not second.ranks and second.master_port == 0
    assert second.message == "waiting for 2 CPU slots; 1 free on n1"
    third = _submit(small, _spec("third", 1))
    assert third.state == pb.JOB_STATE_QUEUED, "FIFO: the slot left is held for 'second'"
    assert third.message == "waiting for 1 CPU slot; none free; 1 held for jobs ahead in the queue"
    assert [e.kind for e in _get(small, third.id).events] == ["job_queued"]
    node_id = first.ranks[0].node_id
    orders = watch_orders(small.stub, node_id)
    assert {o.job_id for o in orders.launches} == {first.id}, "nothing launches for a queued job"

    table = subprocess.run(
        [sys.executable, "-m", "hetero.coordinator.cli", "jobs", "--coordinator", small.address],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert "queued" in table and "2 CPU slots; 1 free on n1" in table

    small.clock.now += 4.0
    _finish(small, first)  # its end frees 3 slots: both queued jobs are placed at once
    second, third = _get(small, second.id), _get(small, third.id)
    assert (second.state, third.state) == (pb.JOB_STATE_PENDING, pb.JOB_STATE_PENDING)
    assert second.message == "" and len(second.ranks) == 2
    assert "after 4.5 s in the queue" in second.events[-1].message
    assert len({first.master_port, second.master_port, third.master_port}) == 3
    orders = watch_orders(small.stub, node_id)
    assert {o.job_id for o in orders.launches} == {second.id, third.id}


def test_higher_priority_goes_first_and_equal_priorities_in_submission_order(small) -> None:  # type: ignore[no-untyped-def]
    running = _submit(small, _spec("running", 4))
    low = _submit(small, _spec("low", 2))
    small.clock.now += 1.0
    high = _submit(small, _spec("high", 2, priority=5))
    small.clock.now += 1.0
    flag = _submit(small, _spec("flag", 2), priority=5)  # the submit flag's field
    assert flag.priority == 5 and high.priority == 5 and low.priority == 0
    assert {j.state for j in (low, high, flag)} == {pb.JOB_STATE_QUEUED}
    _finish(small, running)
    states = {j.name: _get(small, j.id).state for j in (low, high, flag)}
    assert states == {
        "high": pb.JOB_STATE_PENDING,
        "flag": pb.JOB_STATE_PENDING,
        "low": pb.JOB_STATE_QUEUED,
    }
    with pytest.raises(grpc.RpcError) as info:
        _submit(small, _spec("bad", 1), priority=2_000_000)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "priority: must be in [-1,000,000, 1,000,000], got 2,000,000"


def test_a_queued_job_can_be_cancelled_and_is_never_placed(small) -> None:  # type: ignore[no-untyped-def]
    running = _submit(small, _spec("running", 4))
    waiting = _submit(small, _spec("waiting", 1))
    cancelled = small.stub.CancelJob(pb.CancelJobRequest(job_id=waiting.id), timeout=DEADLINE_S)
    assert cancelled.state == pb.JOB_STATE_CANCELLED
    _finish(small, running)
    assert (
        _get(small, waiting.id).state == pb.JOB_STATE_CANCELLED
        and not _get(small, waiting.id).ranks
    )
    # Cancelling the running job instead frees its slots for the queue's next pass.
    running = _submit(small, _spec("running2", 4))
    behind = _submit(small, _spec("behind", 4))
    small.stub.CancelJob(pb.CancelJobRequest(job_id=running.id), timeout=DEADLINE_S)
    small.flush()  # the queue's pass the cancel asked for (the admission task's, run now)
    assert _get(small, behind.id).state == pb.JOB_STATE_PENDING


def test_a_job_that_can_never_fit_is_refused_at_submit_in_one_line(small) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        _submit(small, _spec("huge", 5))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == (
        "job 'huge' needs 5 ranks, more than the 1 registered CPU devices can ever hold "
        "(4 at 4 ranks each (ranks_per_cpu_device)): it would wait for ever"
    )
    assert small.stub.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S).jobs == []
    dry = small.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=_spec("d", 4), dry_run=True), timeout=DEADLINE_S
    )
    assert dry.job.message == "" and len(dry.predictions) == 3
    _submit(small, _spec("busy", 4))
    dry = small.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=_spec("d", 2), dry_run=True), timeout=DEADLINE_S
    )
    assert dry.job.message == "would queue: waiting for 2 CPU slots; none free"


def test_the_sweepers_pass_places_queued_jobs_when_a_node_comes_back(small) -> None:  # type: ignore[no-untyped-def]
    _submit(small, _spec("running", 4))
    waiting = _submit(small, _spec("waiting", 2))
    small.clock.now += 60.0  # n1 silent: down, its job fails; the queued job waits on
    small.sweep()
    assert _get(small, waiting.id).state == pb.JOB_STATE_QUEUED
    assert "down: n1" in _get(small, waiting.id).message
    node_id = small.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes[0].id
    small.stub.Heartbeat(pb.HeartbeatRequest(node_id=node_id), timeout=DEADLINE_S)
    small.sweep()  # no submission, cancel or exit: the periodic pass places it
    assert _get(small, waiting.id).state == pb.JOB_STATE_PENDING


def _set_message(coordinator, job_id: str, message: str) -> None:  # type: ignore[no-untyped-def]
    def stale() -> None:
        coordinator.server.service.state.jobs[job_id].message = message

    coordinator.server.call(stale)


def test_the_sweepers_pass_runs_when_the_devices_may_have_changed_not_every_sweep(small) -> None:  # type: ignore[no-untyped-def]
    # A stale reason written behind the pass's back shows whether a sweep ran the pass.
    _submit(small, _spec("running", 4))
    waiting = _submit(small, _spec("waiting", 2))
    reason = _get(small, waiting.id).message
    small.sweep()  # the first sweep always passes
    _set_message(small, waiting.id, "stale")  # not a change of devices
    small.clock.now += 1.0
    small.sweep()
    assert _get(small, waiting.id).message == "stale", "a pass ran with nothing changed"
    small.clock.now += REFRESH_S
    node_id = small.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes[0].id
    small.stub.Heartbeat(pb.HeartbeatRequest(node_id=node_id), timeout=DEADLINE_S)
    small.sweep()  # the refresh: reasons kept current
    assert _get(small, waiting.id).message == reason
    small.clock.now += 60.0
    small.sweep()  # n1 silent: down, the running job fails and its devices are free...
    assert "down: n1" in _get(small, waiting.id).message  # ...but not healthy
    _set_message(small, waiting.id, "stale")
    small.stub.Heartbeat(pb.HeartbeatRequest(node_id=node_id), timeout=DEADLINE_S)
    small.sweep()  # n1 back: a change the pass must see
    assert _get(small, waiting.id).state == pb.JOB_STATE_PENDING


def test_limits_refuse_beyond_them_with_resource_exhausted(small) -> None:  # type: ignore[no-untyped-def]
    limits = dataclasses.replace(small.settings.limits, jobs_per_user=3, max_spec_bytes=2048)
    small.reconfigure(limits=limits)
    for n in range(3):
        _submit(small, _spec(f"j{n}", 4))
    with pytest.raises(grpc.RpcError) as info:
        _submit(small, _spec("j3", 1))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == (
        "anyone has 3 queued or active jobs, the coordinator's limit (jobs_per_user 3): "
        "cancel some or wait for them to finish"
    )
    big = _spec("big", 1) + "# " + "x" * 3000 + "\n"
    with pytest.raises(grpc.RpcError) as info:
        _submit(small, big)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the coordinator's limit of 2,048 (max_spec_bytes)" in info.value.details()
