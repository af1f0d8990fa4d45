"""API messages from the in-memory state: nodes, jobs, plans, the live view of a job,
the cluster snapshot, launch orders. Read on the event loop (``state`` belongs to it);
the messages of jobs the coordinator no longer holds are built from the database's rows
(``views``), the same fields."""

from __future__ import annotations

import functools
from typing import cast

from hetero.coordinator import throughput, wire
from hetero.coordinator.state import ClusterState, Device, Job, Node, Plan, Rank
from hetero.core.balancer import detect_stragglers
from hetero.core.balancer.straggler import LOOKBACK
from hetero.core.states import RankState
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


@functools.lru_cache(maxsize=4096)
def device_profiles(devices: tuple[Device, ...]) -> tuple[tpb.DeviceProfile, ...]:
    """A node's devices as messages, made once per registration (they never change)."""
    return tuple(wire.device_profile(d) for d in devices)  # type: ignore[arg-type]


def node_message(node: Node, *, now: float, timeout_s: float) -> pb.Node:
    """A node with its newest telemetry (the last heartbeat's; none after a restart
    until its next heartbeat)."""
    msg = pb.Node(
        id=node.id,
        name=node.name,
        address=node.address,
        agent_endpoint=node.agent_endpoint,
        agent_version=node.agent_version,
        healthy=node.healthy(now, timeout_s),
        registered_at_unix_s=node.registered_at_unix_s,
        last_heartbeat_unix_s=node.last_heartbeat_unix_s,
        devices=device_profiles(node.devices),
        draining=node.draining,
    )
    if isinstance(node.host_profile, tpb.HostProfile):
        msg.host_profile.CopyFrom(node.host_profile)
    beat = node.telemetry
    if isinstance(beat, pb.HeartbeatRequest):
        if beat.HasField("host"):
            msg.host.CopyFrom(beat.host)
        msg.telemetry.extend(sorted(beat.devices, key=lambda d: d.device_index))
    return msg


def plan_message(job_id: str, plan: Plan) -> tpb.Plan:
    msg = tpb.Plan(
        job_id=job_id,
        version=plan.version,
        apply_at_step=plan.apply_at_step,
        batches=list(plan.batches),
        policy=plan.policy,
        reason=plan.reason,
    )
    if plan.predicted_step_s is not None:
        msg.predicted_step_s = plan.predicted_step_s
    return msg


def rank_message(r: Rank, node_name: str) -> pb.RankPlacement:
    msg = pb.RankPlacement(
        rank=r.rank,
        node_id=r.node_id,
        node_name=node_name,
        device_index=r.device_index,
        device_kind=wire.KIND_TO_PB.get(r.device_kind, tpb.DEVICE_KIND_UNSPECIFIED),
        device_name=r.device_name,
        local_rank=r.local_rank,
        state=cast("pb.RankState", RankState[r.state].value),
        emulated_slowdown=r.emulated_slowdown,
    )
    if r.exit_code is not None:
        msg.exit_code = r.exit_code
    return msg


def job_message(state: ClusterState, job: Job, *, detail: bool = False) -> pb.Job:
    """The API's view of a job; ``detail`` adds its spec and newest events."""
    names = {r.node_id: _node_name(state, r.node_id) for r in job.ranks}
    msg = pb.Job(
        id=job.id,
        name=job.name,
        state=wire.job_state(job.state),
        policy=job.policy,
        global_batch=job.global_batch,
        world_size=job.world_size,
        backend=job.backend,
        master_addr=job.master_addr,
        master_port=job.master_port,
        submitted_at_unix_s=job.submitted_at_unix_s,
        message=job.message,
        restarts=job.restarts,
        priority=job.priority,
        owner=job.owner,
        launcher=job.launcher,
        ranks=[rank_message(r, names[r.node_id]) for r in job.ranks],
        last_step=job.last_step,
        spec_yaml=job.spec_yaml if detail else "",
    )
    if detail:
        msg.events.extend(
            pb.JobEvent(id=e.id, time_unix_s=e.time_unix_s, kind=e.kind, message=e.message)
            for e in job.events
        )
    if job.finished_at_unix_s is not None:
        msg.finished_at_unix_s = job.finished_at_unix_s
    if job.plan is not None:
        msg.plan.CopyFrom(plan_message(job.id, job.plan))
    live = job_live(job)
    if live is not None:
        msg.live.CopyFrom(live)
    if job.total_steps is not None:
        msg.total_steps = job.total_steps
    return msg


def _node_name(state: ClusterState, node_id: str) -> str:
    node = state.nodes.get(node_id)
    return node.name if node is not None else node_id


def job_live(job: Job) -> pb.JobLive | None:
    """``Job.live`` from the newest complete interval of the current attempt; None
    before the first. Built once per interval and kept on the job (``Job.live``):
    every ``/metrics`` build and job view of a running job reads it, and its straggler
    test alone cost ~1 ms a job."""
    report = job.latest
    if not isinstance(report, tpb.IntervalReport) or not job.history:
        return None
    newest = job.history[-1][0]
    if job.live is not None and job.live[0] is report and job.live[1] == newest:
        return cast(pb.JobLive, job.live[2])
    live = _live(job, report)
    job.live = (report, newest, live)
    return live


def _live(job: Job, report: tpb.IntervalReport) -> pb.JobLive:
    ranks = sorted(report.ranks, key=lambda r: r.rank)
    phases = [
        throughput.RankPhases(
            rank=r.rank,
            batch=r.batch,
            steps=r.steps,
            compute_s=r.compute_s,
            step_s=r.step_s,
            comm_wait_s=r.comm_wait_s if r.HasField("comm_wait_s") else None,
            loss_sum=r.loss_sum if r.HasField("loss_sum") else None,
            samples=r.samples if r.HasField("samples") else None,
        )
        for r in ranks
    ]
    est = throughput.estimate(phases, job.global_batch)
    flags = detect_stragglers([list(rs) for _, rs in list(job.history)[-LOOKBACK:]])
    msg = pb.JobLive(
        end_step=report.end_step,
        plan_version=report.plan_version,
        ranks=ranks,
        stragglers=[
            pb.StragglerFlag(rank=e.rank, ratio=e.ratio, intervals=e.intervals, message=e.message)
            for e in flags
        ],
        emulated=any(r.emulated_slowdown != 1.0 for r in job.ranks),
    )
    for field, value in (
        ("samples_per_s", est.samples_per_s),
        ("equal_samples_per_s", est.equal_samples_per_s),
        ("ideal_samples_per_s", est.ideal_samples_per_s),
        ("loss", est.loss),
    ):
        if value is not None:
            setattr(msg, field, value)
    return msg


#: Jobs a snapshot shows besides the placed ones: the newest queued or recently ended.
WATCH_JOBS = 1000


def snapshot(
    state: ClusterState,
    *,
    now: float,
    timeout_s: float,
    finished_s: float,
    owner: str | None = None,
) -> pb.ClusterSnapshot:
    """Every node; every placed job (pending, running, restarting), and of the others the
    newest :data:`WATCH_JOBS` not finished or finished within ``finished_s``: newest
    first. A flood of queued jobs never hides a running one, and never makes the
    snapshot long to build on the event loop. With ``owner``, only that owner's jobs."""
    placed: list[Job] = []
    others: list[Job] = []
    for j in reversed(state.jobs.values()):  # newest first: the state holds them in order
        if owner is not None and j.owner != owner:
            continue
        if j.placed:
            placed.append(j)
        elif len(others) < WATCH_JOBS and (
            j.finished_at_unix_s is None or now - j.finished_at_unix_s < finished_s
        ):
            others.append(j)
    jobs = sorted([*placed, *others], key=_newest_first)
    return pb.ClusterSnapshot(
        time_unix_s=now,
        nodes=[
            node_message(n, now=now, timeout_s=timeout_s)
            for n in sorted(state.nodes.values(), key=lambda n: n.name)
        ],
        jobs=[job_message(state, j) for j in jobs],
    )


def _newest_first(job: Job) -> tuple[float, str]:
    return (-job.submitted_at_unix_s, job.id)


def launch_message(job: Job, rank: Rank) -> pb.RankLaunch:
    """A launch order: the rank's place in the job, once, and the job's typed options,
    once, as the catalogue's text (the agent makes the argv and environment of them:
    ``hetero.agent.orders.rank_process``)."""
    spec = job.spec
    args = pb.TrainingArgs(
        command=list(spec.command),
        options=spec.launch_options(),
        resume=spec.checkpoint is not None and job.restarts > 0,
    )
    msg = pb.RankLaunch(
        job_id=job.id,
        rank=rank.rank,
        world_size=job.world_size,
        local_rank=rank.local_rank,
        master_addr=job.master_addr,
        master_port=job.master_port,
        backend=job.backend,
        device_index=rank.device_index,
        device_kind=wire.KIND_TO_PB.get(rank.device_kind, tpb.DEVICE_KIND_UNSPECIFIED),
        emulated_slowdown=rank.emulated_slowdown,
        args=args,
        attempt=job.restarts,
        collective_timeout_s=spec.collective_timeout_s or 0.0,
    )
    if job.plan is not None:
        msg.plan.CopyFrom(plan_message(job.id, job.plan))
    return msg
