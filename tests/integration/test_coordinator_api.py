"""The Coordinator over real gRPC and a real SQLite file, then PostgreSQL: nodes, jobs,
plans, errors."""

from __future__ import annotations

import grpc
import pytest
from simcluster import watch_orders

from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


@pytest.fixture
def db_url(both_stores_url: str) -> str:
    return both_stores_url


DEMO = """\
name: demo
model: simple_cnn
global_batch: 96
steps: 100
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 3
  device: cpu
emulate_slowdown: [1, 2, 3]
"""
DEADLINE_S = 5.0


def _register(c, name: str, score: float = 1.0, kind: int = tpb.DEVICE_KIND_CPU) -> str:  # type: ignore[no-untyped-def]
    resp = c.stub.RegisterNode(
        pb.RegisterNodeRequest(
            name=name,
            address=f"{name}.local",
            agent_endpoint=f"{name}.local:7071",
            devices=[tpb.DeviceProfile(index=0, name="cpu", kind=kind, compute_score=score)],
        ),
        timeout=DEADLINE_S,
    )
    return str(resp.node_id)


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def test_nodes_register_heartbeat_and_report_telemetry_with_na_fields(coordinator) -> None:  # type: ignore[no-untyped-def]
    node_id = _register(coordinator, "n1")
    again = _register(coordinator, "n1", score=2.0)
    assert again == node_id, "re-registering a name keeps the node id"
    coordinator.stub.Heartbeat(
        pb.HeartbeatRequest(
            node_id=node_id,
            host=tpb.HostTelemetry(cpu_percent=42.0, ram_total_bytes=8 << 30),
            devices=[tpb.DeviceTelemetry(device_index=0, utilization_percent=90.0)],
        ),
        timeout=DEADLINE_S,
    )
    (node,) = coordinator.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
    assert node.healthy and node.devices[0].compute_score == 2.0
    assert node.host.cpu_percent == 42.0 and not node.host.HasField("ram_used_bytes")
    assert node.telemetry[0].utilization_percent == 90.0
    assert not node.telemetry[0].HasField("temperature_c"), "unsupported stays n/a"
    coordinator.clock.now += 30.0
    (node,) = coordinator.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
    assert not node.healthy, "a node silent past the timeout is unhealthy"


def test_submit_places_ranks_and_agents_receive_launch_orders(coordinator) -> None:  # type: ignore[no-untyped-def]
    node_id = _register(coordinator, "n1")
    dry = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=DEMO, dry_run=True), timeout=DEADLINE_S
    )
    assert dry.job_id == "" and dry.job.backend == "gloo"
    predicted = {p.policy: p for p in dry.predictions}
    assert predicted["dynamic"].predicted_samples_per_s > predicted["equal"].predicted_samples_per_s
    assert predicted["dynamic"].emulated
    assert coordinator.stub.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S).jobs == []

    resp = coordinator.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=DEMO), timeout=DEADLINE_S)
    job = resp.job
    assert job.state == pb.JOB_STATE_PENDING and job.world_size == 3
    # dynamic starts equal and moves on measurements; proportional starts from the
    # profiles (the emulated slowdowns 1, 2, 3 on equal scores).
    assert list(job.plan.batches) == [32, 32, 32] and job.plan.version == 1
    by_profile = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(
            spec_yaml=DEMO.replace("policy: dynamic", "policy: proportional"), dry_run=True
        ),
        timeout=DEADLINE_S,
    )
    assert list(by_profile.job.plan.batches) == [52, 26, 18]

    orders = watch_orders(coordinator.stub, node_id)
    assert [o.rank for o in orders.launches] == [0, 1, 2]
    one = orders.launches[1]
    assert (one.rank, one.world_size, one.local_rank) == (1, 3, 1)
    assert one.master_addr == "n1.local" and one.master_port == job.master_port
    assert one.job_id == resp.job_id and one.backend == "gloo"
    assert (
        orders.launches[2].args.options["model"] == "simple_cnn"
        and orders.launches[2].emulated_slowdown == 3.0
    )

    for rank in range(3):
        coordinator.stub.ReportRankStatus(
            pb.ReportRankStatusRequest(
                node_id=node_id, job_id=resp.job_id, rank=rank, state=pb.RANK_STATE_RUNNING
            ),
            timeout=DEADLINE_S,
        )
    assert watch_orders(coordinator.stub, node_id).launches == []
    got = coordinator.stub.GetJob(pb.GetJobRequest(job_id=resp.job_id), timeout=DEADLINE_S)
    assert got.state == pb.JOB_STATE_RUNNING and "emulate_slowdown" in got.spec_yaml
    for rank, code in ((0, 0), (1, 0), (2, 0)):
        last = coordinator.stub.ReportRankStatus(
            pb.ReportRankStatusRequest(
                node_id=node_id,
                job_id=resp.job_id,
                rank=rank,
                state=pb.RANK_STATE_EXITED,
                exit_code=code,
            ),
            timeout=DEADLINE_S,
        )
    assert last.job_state == pb.JOB_STATE_SUCCEEDED


def _report(
    c, job_id: str, end_step: int, batches: list[int], per_sample_s: list[float]
) -> tpb.Plan:  # type: ignore[no-untyped-def]
    report = tpb.IntervalReport(job_id=job_id, end_step=end_step, plan_version=1)
    for rank, (b, a) in enumerate(zip(batches, per_sample_s, strict=True)):
        report.ranks.add(rank=rank, batch=b, steps=10, compute_s=a * b + 0.001, step_s=0.5)
    return c.stub.ReportIntervalStats(report, timeout=DEADLINE_S).plan  # type: ignore[no-any-return]


def test_reported_stats_move_the_plan_toward_the_slower_rank(coordinator) -> None:  # type: ignore[no-untyped-def]
    _register(coordinator, "n1")
    _register(coordinator, "n2")
    spec = DEMO.replace("ranks: 3", "ranks: 2").replace("emulate_slowdown: [1, 2, 3]", "")
    job_id = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S
    ).job_id
    initial = coordinator.stub.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S)
    assert list(initial.batches) == [48, 48]
    # Rank 1 measures 3x slower per sample. Step 5 is not a boundary: no re-plan.
    plan = _report(coordinator, job_id, 5, [48, 48], [0.001, 0.003])
    assert plan.version == 1
    plan = _report(coordinator, job_id, 10, [48, 48], [0.001, 0.003])
    assert plan.version == 2 and plan.apply_at_step == 10
    assert plan.batches[1] < plan.batches[0] and sum(plan.batches) == 96
    assert list(plan.batches) == [72, 24]
    latest = coordinator.stub.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S)
    assert latest == plan
    job = coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
    assert job.last_step == 10 and any(e.kind == "replanned" for e in job.events)


def test_a_report_that_ran_the_old_batches_makes_no_plan_version_without_a_change(
    coordinator,
) -> None:  # type: ignore[no-untyped-def]
    # A trainer applies plan v2 after its loader's prefetch: the interval it reports with
    # version 2 still ran v1's batches, and the balancer chooses v2's batches again.
    _register(coordinator, "n1")
    _register(coordinator, "n2")
    spec = DEMO.replace("ranks: 3", "ranks: 2").replace("emulate_slowdown: [1, 2, 3]", "")
    job_id = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S
    ).job_id
    v2 = _report(coordinator, job_id, 10, [48, 48], [0.001, 0.003])
    assert v2.version == 2 and list(v2.batches) == [72, 24]
    again = tpb.IntervalReport(job_id=job_id, end_step=20, plan_version=2)
    for rank, (b, a) in enumerate(zip([48, 48], [0.001, 0.003], strict=True)):
        again.ranks.add(rank=rank, batch=b, steps=10, compute_s=a * b + 0.001, step_s=0.5)
    plan = coordinator.stub.ReportIntervalStats(again, timeout=DEADLINE_S).plan
    assert plan.version == 2 and list(plan.batches) == [72, 24]
    job = coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
    assert [e.message.split(":")[0] for e in job.events if e.kind == "replanned"] == ["plan v2"]


def test_the_coordinator_plans_busy_time_from_the_reported_phases(coordinator) -> None:  # type: ignore[no-untyped-def]
    """Equal compute, but rank 1 waits for its input and steps a slower optimizer: the
    re-plan moves samples off it. A report with a negative phase is refused."""
    _register(coordinator, "n1")
    _register(coordinator, "n2")
    spec = DEMO.replace("ranks: 3", "ranks: 2").replace("emulate_slowdown: [1, 2, 3]", "")
    job_id = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S
    ).job_id
    report = tpb.IntervalReport(job_id=job_id, end_step=10, plan_version=1)
    for rank, (data_s, optimizer_s) in enumerate(((0.0, 0.003), (0.02, 0.03))):
        report.ranks.add(
            rank=rank,
            batch=48,
            steps=10,
            compute_s=0.05,
            step_s=0.11,
            data_s=data_s,
            optimizer_s=optimizer_s,
        )
    plan = coordinator.stub.ReportIntervalStats(report, timeout=DEADLINE_S).plan
    assert plan.version == 2 and plan.batches[1] < plan.batches[0] and sum(plan.batches) == 96
    report.end_step, report.plan_version = 20, 2
    report.ranks[1].optimizer_s = -0.01
    with pytest.raises(grpc.RpcError) as info:
        coordinator.stub.ReportIntervalStats(report, timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_list_get_cancel_and_stop_orders(coordinator) -> None:  # type: ignore[no-untyped-def]
    node_id = _register(coordinator, "n1")
    first = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=DEMO), timeout=DEADLINE_S
    ).job_id
    second = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=DEMO.replace("name: demo", "name: two")), timeout=DEADLINE_S
    ).job_id
    jobs = coordinator.stub.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S).jobs
    assert {j.id for j in jobs} == {first, second}
    coordinator.stub.ReportRankStatus(
        pb.ReportRankStatusRequest(
            node_id=node_id, job_id=first, rank=0, state=pb.RANK_STATE_RUNNING
        ),
        timeout=DEADLINE_S,
    )
    cancelled = coordinator.stub.CancelJob(pb.CancelJobRequest(job_id=first), timeout=DEADLINE_S)
    assert cancelled.state == pb.JOB_STATE_CANCELLED
    assert [r.state for r in cancelled.ranks] == [
        pb.RANK_STATE_STOPPING,
        pb.RANK_STATE_EXITED,
        pb.RANK_STATE_EXITED,
    ]
    orders = watch_orders(coordinator.stub, node_id)
    assert [(s.job_id, s.rank) for s in orders.stops] == [(first, 0)]
    assert {o.job_id for o in orders.launches} == {second}
    running = coordinator.stub.ListJobs(
        pb.ListJobsRequest(states=[pb.JOB_STATE_PENDING]), timeout=DEADLINE_S
    )
    assert [j.id for j in running.jobs] == [second]


def test_logs_append_and_page(coordinator) -> None:  # type: ignore[no-untyped-def]
    _register(coordinator, "n1")
    job_id = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=DEMO), timeout=DEADLINE_S
    ).job_id
    lines = [pb.LogLine(rank=r, text=f"line {r}") for r in range(3)]
    coordinator.stub.AppendJobLogs(
        pb.AppendJobLogsRequest(job_id=job_id, lines=lines), timeout=DEADLINE_S
    )
    page = coordinator.stub.GetJobLogs(
        pb.GetJobLogsRequest(job_id=job_id, limit=2), timeout=DEADLINE_S
    )
    assert [line.text for line in page.lines] == ["line 0", "line 1"]
    rest = coordinator.stub.GetJobLogs(
        pb.GetJobLogsRequest(job_id=job_id, after_seq=page.next_seq), timeout=DEADLINE_S
    )
    assert [line.text for line in rest.lines] == ["line 2"]


def test_errors_leave_as_proper_status_codes_never_unknown(coordinator) -> None:  # type: ignore[no-untyped-def]
    s = coordinator.stub
    bad = DEMO.replace("global_batch: 96", "global_batch: 0")
    with pytest.raises(grpc.RpcError) as info:
        s.SubmitJob(pb.SubmitJobRequest(spec_yaml=bad, source_name="demo.yaml"), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "demo.yaml:3: global_batch: must be >= 1, got 0"
    # No nodes yet: placement cannot succeed.
    assert (
        _code(lambda: s.SubmitJob(pb.SubmitJobRequest(spec_yaml=DEMO), timeout=DEADLINE_S))
        == grpc.StatusCode.FAILED_PRECONDITION
    )
    assert (
        _code(lambda: s.GetJob(pb.GetJobRequest(job_id="nope"), timeout=DEADLINE_S))
        == grpc.StatusCode.NOT_FOUND
    )
    assert (
        _code(lambda: s.CancelJob(pb.CancelJobRequest(job_id="nope"), timeout=DEADLINE_S))
        == grpc.StatusCode.NOT_FOUND
    )
    assert (
        _code(lambda: s.GetPlan(tpb.GetPlanRequest(job_id="nope"), timeout=DEADLINE_S))
        == grpc.StatusCode.NOT_FOUND
    )
    assert (
        _code(lambda: s.Heartbeat(pb.HeartbeatRequest(node_id="nope"), timeout=DEADLINE_S))
        == grpc.StatusCode.NOT_FOUND
    )
    assert (
        _code(lambda: s.RegisterNode(pb.RegisterNodeRequest(name=""), timeout=DEADLINE_S))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    _register(coordinator, "n1")
    job_id = s.SubmitJob(pb.SubmitJobRequest(spec_yaml=DEMO), timeout=DEADLINE_S).job_id
    wrong = tpb.IntervalReport(
        job_id=job_id, end_step=10, ranks=[tpb.RankIntervalStats(rank=0, batch=1, steps=1)]
    )
    assert (
        _code(lambda: s.ReportIntervalStats(wrong, timeout=DEADLINE_S))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert s.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S).jobs[0].id == job_id, (
        "bad spec stored nothing"
    )
    assert len(s.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S).jobs) == 1


def test_health_reflection_and_watch_stream(coordinator) -> None:  # type: ignore[no-untyped-def]
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(coordinator.channel)
    status = health.Check(
        health_pb2.HealthCheckRequest(service="hetero.v1.Coordinator"), timeout=DEADLINE_S
    )
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(coordinator.channel)
    answers = refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=DEADLINE_S
    )
    names = {s.name for s in next(answers).list_services_response.service}
    assert "hetero.v1.Coordinator" in names

    _register(coordinator, "n1")
    stream = coordinator.stub.WatchCluster(pb.WatchClusterRequest(period_s=0.2), timeout=DEADLINE_S)
    first = next(stream)
    assert [n.name for n in first.nodes] == ["n1"]
    stream.cancel()


def test_text_longer_than_its_column_is_refused_or_cut_on_every_store(coordinator) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL enforces a VARCHAR's length (SQLite stores any): what a client sends
    is checked or cut to the column before it is written, never an INTERNAL error."""
    s = coordinator.stub
    long_device = tpb.DeviceProfile(index=0, name="d" * 256, kind=tpb.DEVICE_KIND_CPU)
    for req in (
        pb.RegisterNodeRequest(name="n1", address="a", devices=[long_device]),
        pb.RegisterNodeRequest(name="n1", address="a", agent_version="v" * 65),
    ):
        assert _code(lambda r=req: s.RegisterNode(r, timeout=DEADLINE_S)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
    node_id = _register(coordinator, "n1")
    reasons = [f"reason_number_{i}" for i in range(40)]  # 40 x 16 characters and commas
    s.Heartbeat(
        pb.HeartbeatRequest(
            node_id=node_id,
            devices=[
                tpb.DeviceTelemetry(device_index=0, throttle=tpb.ThrottleReasons(reasons=reasons))
            ],
        ),
        timeout=DEADLINE_S,
    )
    (node,) = s.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
    assert list(node.telemetry[0].throttle.reasons[:3]) == reasons[:3]
    job_id = s.SubmitJob(pb.SubmitJobRequest(spec_yaml=DEMO), timeout=DEADLINE_S).job_id
    line = pb.LogLine(rank=0, stream="stderr-and-more", text="x")
    logs = pb.AppendJobLogsRequest(job_id=job_id, lines=[line])
    assert _code(lambda: s.AppendJobLogs(logs, timeout=DEADLINE_S)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


def test_alike_ranks_get_one_event_saying_hetero_is_not_helping(coordinator) -> None:  # type: ignore[no-untyped-def]
    _register(coordinator, "n1")
    _register(coordinator, "n2")
    spec = DEMO.replace("ranks: 3", "ranks: 2").replace("emulate_slowdown: [1, 2, 3]", "")
    job_id = coordinator.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S
    ).job_id
    for end in (10, 20, 30):
        plan = _report(coordinator, job_id, end, [48, 48], [0.001, 0.001])
        assert plan.version == 1
    job = coordinator.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
    said = [e.message for e in job.events if e.kind == "not-helping"]
    assert len(said) == 1 and said[0].startswith("hetero is not helping here: devices alike")
