"""Exclusion through the real Coordinator API (gRPC on port 0, SQLite under tmp_path).

The test plays the agents' part with the RPCs they use: it reports intervals in
which rank 1 is EMULATED 8x slower on a step with a fixed cost, so the measured
forecast says the job is faster on rank 0 alone. Pinned here: a built-in job
with a checkpoint restarts without the rank only after the forecast agreed for
``CONSECUTIVE`` intervals, keeps it out at its later restarts and spends none of
its ``max_restarts`` on it; a ``command:`` job (off by default) and a job with
no checkpoint are left alone while they run (the latter loses the rank at its
next restart after a failure); a first start keeps every rank, and ``--dry-run``
says what the hardware profiles forecast.
"""

from __future__ import annotations

from simcluster import watch_orders
from sqlalchemy import text

from hetero.core.balancer.exclusion import CONSECUTIVE
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
BUILTIN = """\
name: shed
model: debug
global_batch: 16
steps: 400
rebalance_interval: 4
max_restarts: 1
emulate_slowdown: {{1: {factor}}}
resources: {{ranks: 2, device: cpu}}
"""
CHECKPOINT = "checkpoint: {dir: /tmp/ckpt, interval_steps: 4}\n"
COMMAND = """\
name: keep
command: python train.py
global_batch: 16
steps: 400
rebalance_interval: 4
emulate_slowdown: {1: 8}
resources: {ranks: 2, device: cpu}
"""
#: Rank r's step: (per-sample s + fixed s) x its emulated factor.
PER_SAMPLE_S, FIXED_S, COMM_S = 0.0002, 0.004, 0.003


def _register(c, name: str = "node", score: float = 1.0, slowdown: float = 1.0) -> str:  # type: ignore[no-untyped-def]
    device = tpb.DeviceProfile(
        index=0,
        name="cpu",
        kind=tpb.DEVICE_KIND_CPU,
        compute_score=score,
        emulated_slowdown=slowdown,
    )
    req = pb.RegisterNodeRequest(name=name, address=f"{name}.local", devices=[device])
    return str(c.stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _submit(c, spec: str, dry_run: bool = False) -> pb.SubmitJobResponse:  # type: ignore[no-untyped-def]
    req = pb.SubmitJobRequest(spec_yaml=spec, dry_run=dry_run)
    return c.stub.SubmitJob(req, timeout=DEADLINE_S)


def _job(c, job_id: str) -> pb.Job:  # type: ignore[no-untyped-def]
    return c.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)


def _status(c, node, job_id, rank, state, code=None, attempt=0):  # type: ignore[no-untyped-def]
    req = pb.ReportRankStatusRequest(
        node_id=node, job_id=job_id, rank=rank, state=state, attempt=attempt
    )
    if code is not None:
        req.exit_code = code
    return c.stub.ReportRankStatus(req, timeout=DEADLINE_S)


def _run(c, node: str | dict[str, str], job: pb.Job, intervals: int, attempt: int = 0) -> pb.Job:  # type: ignore[no-untyped-def]
    """Start the job's ranks (``node``: the node's id, or ids by node name) and report
    ``intervals`` intervals at the current plan."""
    for r in job.ranks:
        on = node if isinstance(node, str) else node[r.node_name]
        _status(c, on, job.id, r.rank, pb.RANK_STATE_RUNNING, attempt=attempt)
    plan, step = job.plan, job.last_step
    factors = [r.emulated_slowdown or 1.0 for r in job.ranks]
    for _ in range(intervals):
        step += 4
        compute = [
            (PER_SAMPLE_S * b + FIXED_S) * f for b, f in zip(plan.batches, factors, strict=True)
        ]
        wall = max(compute) + COMM_S
        report = tpb.IntervalReport(job_id=job.id, end_step=step, plan_version=plan.version)
        for rank, (b, t) in enumerate(zip(plan.batches, compute, strict=True)):
            report.ranks.add(rank=rank, batch=b, steps=4, compute_s=t, step_s=wall)
        plan = c.stub.ReportIntervalStats(report, timeout=DEADLINE_S).plan
        if _job(c, job.id).state != pb.JOB_STATE_RUNNING:
            break
    return _job(c, job.id)


def _events(c, job_id: str, kind: str) -> list[str]:  # type: ignore[no-untyped-def]
    c.flush()
    with c.engine.connect() as db:
        rows = db.execute(
            text("SELECT message FROM events WHERE job_id = :j AND kind = :k ORDER BY id"),
            {"j": job_id, "k": kind},
        )
        return [m for (m,) in rows.all()]


def _sweep(c) -> None:  # type: ignore[no-untyped-def]
    c.sweep()


def _stop_all(c, node: str, job: pb.Job, attempt: int) -> None:  # type: ignore[no-untyped-def]
    for r in job.ranks:
        _status(c, node, job.id, r.rank, pb.RANK_STATE_EXITED, 143, attempt=attempt)


def test_a_built_in_job_restarts_once_without_its_slow_rank_and_keeps_it_out(coordinator) -> None:  # type: ignore[no-untyped-def]
    node = _register(coordinator)
    job = _submit(coordinator, BUILTIN.format(factor=8) + CHECKPOINT).job
    assert job.world_size == 2, "profiles alone leave the 8x rank in (its share is 2 of 16)"

    job = _run(coordinator, node, job, intervals=CONSECUTIVE)
    assert job.state == pb.JOB_STATE_RUNNING, "one interval short of agreeing forecasts"
    job = _run(coordinator, node, job, intervals=20)
    assert job.state == pb.JOB_STATE_RESTARTING
    assert job.message == "restarting from its checkpoint without rank 1"
    (why,) = _events(coordinator, job.id, "rank_excluded")
    assert why.startswith("job shed: rank 1 (cpu on node, emulated x8) left out, from the job's")
    assert "would raise predicted throughput by" in why and "no all-reduce with one rank" in why

    _stop_all(coordinator, node, job, attempt=0)
    _sweep(coordinator)
    job = _job(coordinator, job.id)
    assert (job.state, job.world_size, job.restarts) == (pb.JOB_STATE_PENDING, 1, 1)
    assert list(job.plan.batches) == [16], "the global batch is unchanged"
    assert [r.emulated_slowdown for r in job.ranks] == [1.0], "the 8x rank is the one gone"

    # A failure later restarts it on one rank still, and the exclusion used no restart.
    (launch,) = watch_orders(coordinator.stub, node).launches
    assert (launch.rank, launch.attempt, launch.world_size) == (0, 1, 1)
    _status(coordinator, node, job.id, 0, pb.RANK_STATE_RUNNING, attempt=1)
    resp = _status(coordinator, node, job.id, 0, pb.RANK_STATE_EXITED, 1, attempt=1)
    assert resp.job_state == pb.JOB_STATE_PENDING, "max_restarts 1 was unspent: placed again"
    job = _job(coordinator, job.id)
    assert (job.state, job.world_size, job.restarts) == (pb.JOB_STATE_PENDING, 1, 2)
    assert len(_events(coordinator, job.id, "rank_excluded")) == 1


def test_two_slow_ranks_leave_one_per_restart_each_on_its_attempts_own_measurements(
    coordinator,
) -> None:  # type: ignore[no-untyped-def]
    """A fast device beside two slow ones (a GPU beside two CPU ranks): the first
    restart leaves the slowest rank out; the second attempt, measured without it, still
    forecasts a faster job without the other, so the next restart leaves that one out
    too. The job never loses its last rank and keeps its global batch.

    The two are 8x and 4x slow. Two ranks alike in slowness, each at ``min_batch``, hold
    the job back equally, so leaving one out gains nothing, and the job measures that
    once its intervals spread their batches (it starts at equal batches)."""
    node = _register(coordinator)
    spec = (
        BUILTIN.format(factor=8).replace("{1: 8}", "{1: 8, 2: 4}").replace("ranks: 2", "ranks: 3")
    )
    job = _submit(coordinator, spec + CHECKPOINT).job
    assert job.world_size == 3
    job = _run(coordinator, node, job, intervals=20)
    assert job.state == pb.JOB_STATE_RESTARTING, job.message
    _stop_all(coordinator, node, job, attempt=0)
    _sweep(coordinator)
    job = _job(coordinator, job.id)
    assert (job.state, job.world_size) == (pb.JOB_STATE_PENDING, 2)
    assert sorted(r.emulated_slowdown for r in job.ranks) == [1.0, 4.0]

    job = _run(coordinator, node, job, intervals=20, attempt=1)
    assert job.state == pb.JOB_STATE_RESTARTING, job.message
    _stop_all(coordinator, node, job, attempt=1)
    _sweep(coordinator)
    job = _job(coordinator, job.id)
    assert (job.state, job.world_size) == (pb.JOB_STATE_PENDING, 1)
    assert [r.emulated_slowdown for r in job.ranks] == [1.0]
    assert list(job.plan.batches) == [16], "the global batch is unchanged"
    assert len(_events(coordinator, job.id, "rank_excluded")) == 2

    job = _run(coordinator, node, job, intervals=20, attempt=2)
    assert job.state == pb.JOB_STATE_RUNNING, "the last rank stays"


def test_a_slow_device_is_left_out_of_every_later_placement(coordinator) -> None:  # type: ignore[no-untyped-def]
    fast = _register(coordinator, "node-fast")
    # Scored 10x faster, but EMULATED 80x slower: 8x slower in effect, as above.
    slow = _register(coordinator, "node-slow", score=10.0, slowdown=80.0)
    spec = BUILTIN.format(factor=1).replace("emulate_slowdown: {1: 1}\n", "") + CHECKPOINT
    job = _submit(coordinator, spec).job
    where = {r.rank: r.node_name for r in job.ranks}
    assert sorted(where.values()) == ["node-fast", "node-slow"]
    nodes = {"node-fast": fast, "node-slow": slow}
    job = _run(coordinator, nodes, job, intervals=12)
    assert job.state == pb.JOB_STATE_RESTARTING
    (why,) = _events(coordinator, job.id, "rank_excluded")
    slow_rank = next(r for r, n in where.items() if n == "node-slow")
    assert f"rank {slow_rank} (cpu on node-slow, emulated x80)" in why
    for r in job.ranks:
        _status(coordinator, nodes[r.node_name], job.id, r.rank, pb.RANK_STATE_EXITED, 143)
    job = _job(coordinator, job.id)
    assert job.world_size == 1 and [r.node_name for r in job.ranks] == ["node-fast"], (
        "the higher-scored device was left out: the measurements said it is slow"
    )


def test_command_or_uncheckpointed_jobs_keep_every_rank_while_running(coordinator) -> None:  # type: ignore[no-untyped-def]
    node = _register(coordinator)
    command = _submit(coordinator, COMMAND + CHECKPOINT).job
    command = _run(coordinator, node, command, intervals=12)
    no_checkpoint = _submit(coordinator, BUILTIN.format(factor=8)).job
    no_checkpoint = _run(coordinator, node, no_checkpoint, intervals=12)
    for job in (command, no_checkpoint):
        assert (job.state, job.world_size) == (pb.JOB_STATE_RUNNING, 2)
        assert _events(coordinator, job.id, "rank_excluded") == []
    assert _events(coordinator, command.id, "straggler"), "rank 1 was flagged all the same"

    # A failure restarts the job that had no checkpoint: that restart leaves rank 1 out.
    _status(coordinator, node, no_checkpoint.id, 0, pb.RANK_STATE_EXITED, 1)
    _status(coordinator, node, no_checkpoint.id, 1, pb.RANK_STATE_EXITED, 143)
    restarted = _job(coordinator, no_checkpoint.id)
    assert (restarted.state, restarted.world_size) == (pb.JOB_STATE_PENDING, 1)
    (why,) = _events(coordinator, no_checkpoint.id, "rank_excluded")
    assert "rank 1 (cpu on node, emulated x8) left out, from the job's measured" in why

    allowed = COMMAND.replace("device: cpu}", "device: cpu, allow_exclusion: true}")
    job = _run(coordinator, node, _submit(coordinator, allowed + CHECKPOINT).job, intervals=12)
    assert job.state == pb.JOB_STATE_RESTARTING, "a command job may opt in"


def test_a_first_start_keeps_every_rank_and_dry_run_says_what_profiles_forecast(
    coordinator,
) -> None:  # type: ignore[no-untyped-def]
    _register(coordinator)
    spec = BUILTIN.format(factor=40)
    dry = _submit(coordinator, spec, dry_run=True)
    assert dry.job.world_size == 2
    assert dry.job.message.startswith("profiles say rank 1 holds the job back even at min_batch 1")
    assert "excluding rank 1 would raise predicted throughput" in dry.job.message
    job = _submit(coordinator, spec).job
    assert job.world_size == 2 and _events(coordinator, job.id, "rank_excluded") == []

    kept = _submit(coordinator, COMMAND.replace("{1: 8}", "{1: 40}"), dry_run=True)
    assert kept.job.world_size == 2 and "profiles say" not in kept.job.message
