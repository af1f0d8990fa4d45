"""Conversions between ``hetero.v1`` messages and the coordinator's rows and dataclasses.

The one place that knows both shapes; unset optional proto fields become NULL
("n/a") and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from google.protobuf import json_format

from hetero.coordinator import placement as placement_mod
from hetero.coordinator import store, throughput
from hetero.coordinator.models import (
    DeviceRow,
    EventRow,
    IntervalStatRow,
    JobRow,
    PlanRow,
    RankRow,
)
from hetero.coordinator.state import Device
from hetero.core.balancer import Link, StragglerEvidence
from hetero.core.jobspec import JobSpec
from hetero.core.states import JobState, RankState
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

KIND_TO_PB = {"cpu": tpb.DEVICE_KIND_CPU, "cuda": tpb.DEVICE_KIND_CUDA}
PB_TO_KIND = {v: k for k, v in KIND_TO_PB.items()}


def _opt(msg: object, field: str) -> object | None:
    return getattr(msg, field) if msg.HasField(field) else None  # type: ignore[attr-defined]


def device(d: tpb.DeviceProfile) -> Device:
    """A registration's device as the coordinator holds it (``state.Device``)."""
    row = device_row(d)
    return Device(
        index=row.index,
        name=row.name,
        kind=row.kind,
        compute_score=row.compute_score,
        matmul_tflops=row.matmul_tflops,
        memory_bandwidth_bytes_per_s=row.memory_bandwidth_bytes_per_s,
        host_to_device_bytes_per_s=row.host_to_device_bytes_per_s,
        device_to_host_bytes_per_s=row.device_to_host_bytes_per_s,
        memory_bytes=row.memory_bytes,
        emulated_slowdown=row.emulated_slowdown,
        suspect=row.suspect,
        shared_while_profiled=row.shared_while_profiled,
        foreign_utilization_percent=row.foreign_utilization_percent,
    )


def device_row(d: tpb.DeviceProfile) -> DeviceRow:
    return DeviceRow(
        index=d.index,
        name=d.name or f"device{d.index}",
        kind=PB_TO_KIND.get(d.kind, "cpu"),
        matmul_tflops=_opt(d, "matmul_tflops"),
        memory_bandwidth_bytes_per_s=_opt(d, "memory_bandwidth_bytes_per_s"),
        host_to_device_bytes_per_s=_opt(d, "host_to_device_bytes_per_s"),
        device_to_host_bytes_per_s=_opt(d, "device_to_host_bytes_per_s"),
        memory_bytes=_opt(d, "memory_bytes"),
        compute_score=d.compute_score,
        emulated_slowdown=d.emulated_slowdown or 1.0,
        suspect=",".join(d.suspect),
        shared_while_profiled=d.shared_while_profiled,
        foreign_utilization_percent=_opt(d, "foreign_utilization_percent"),
    )


def device_profile(d: DeviceRow) -> tpb.DeviceProfile:
    msg = tpb.DeviceProfile(
        index=d.index,
        name=d.name,
        kind=KIND_TO_PB.get(d.kind, tpb.DEVICE_KIND_UNSPECIFIED),
        compute_score=d.compute_score,
        emulated_slowdown=d.emulated_slowdown,
        suspect=[f for f in (d.suspect or "").split(",") if f],
        shared_while_profiled=bool(d.shared_while_profiled),
    )
    for field in (
        "foreign_utilization_percent",
        "matmul_tflops",
        "memory_bandwidth_bytes_per_s",
        "host_to_device_bytes_per_s",
        "device_to_host_bytes_per_s",
        "memory_bytes",
    ):
        value = getattr(d, field)
        if value is not None:
            setattr(msg, field, value)
    return msg


_DEVICE_FIELDS = (
    "utilization_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
)
_HOST_FIELDS = ("cpu_percent", "ram_used_bytes", "ram_total_bytes")


#: Longest stored list of throttle reasons, in characters (the column's length, which
#: PostgreSQL enforces).
MAX_THROTTLE_CHARS = 255


def telemetry_values(req: pb.HeartbeatRequest) -> tuple[dict[str, object], ...]:
    """A heartbeat's samples as ``TelemetryRow`` column values (``device_index`` None =
    host): plain dicts, since the ingest writes them in bulk (an ORM object per
    sample cost more than writing it)."""
    rows: list[dict[str, object]] = []
    if req.HasField("host"):
        host: dict[str, object] = {"device_index": None}
        for field in _HOST_FIELDS:
            host[field] = _opt(req.host, field)
        rows.append(host)
    for d in req.devices:
        row: dict[str, object] = {"device_index": d.device_index}
        for field in _DEVICE_FIELDS:
            row[field] = _opt(d, field)
        reasons = ",".join(d.throttle.reasons)[:MAX_THROTTLE_CHARS]
        row["throttle_reasons"] = reasons if d.HasField("throttle") else None
        rows.append(row)
    return tuple(rows)


def plan_message(plan: PlanRow) -> tpb.Plan:
    msg = tpb.Plan(
        job_id=plan.job_id,
        version=plan.version,
        apply_at_step=plan.apply_at_step,
        batches=list(store.plan_batches(plan)),
        policy=plan.policy,
        reason=plan.reason,
    )
    if plan.predicted_step_s is not None:
        msg.predicted_step_s = plan.predicted_step_s
    return msg


def rank_message(r: RankRow, node_name: str) -> pb.RankPlacement:
    msg = pb.RankPlacement(
        rank=r.rank,
        node_id=r.node_id,
        node_name=node_name,
        device_index=r.device_index,
        device_kind=KIND_TO_PB.get(r.device_kind, tpb.DEVICE_KIND_UNSPECIFIED),
        device_name=r.device_name,
        local_rank=r.local_rank,
        state=cast("pb.RankState", RankState[r.state].value),
        emulated_slowdown=r.emulated_slowdown,
    )
    if r.exit_code is not None:
        msg.exit_code = r.exit_code
    return msg


def job_state(name: str) -> pb.JobState:
    """A stored state name as the message's enum value. The numbers are the proto's
    (``hetero.core.states``, pinned by a test); protoc's stubs type an enum field as
    its own ``int`` subclass, so the cast is for mypy alone."""
    return cast("pb.JobState", JobState[name].value)


def job_message(
    job: JobRow,
    plan: PlanRow | None,
    node_names: dict[str, str],
    events: Sequence[EventRow] = (),
    with_spec: bool = False,
    live: pb.JobLive | None = None,
) -> pb.Job:
    msg = pb.Job(
        id=job.id,
        name=job.name,
        state=job_state(job.state),
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
        ranks=[rank_message(r, node_names.get(r.node_id, r.node_id)) for r in job.ranks],
        last_step=job.last_step,
        spec_yaml=job.spec_yaml if with_spec else "",
        events=[
            pb.JobEvent(id=e.id, time_unix_s=e.time_unix_s, kind=e.kind, message=e.message)
            for e in events
        ],
    )
    if job.finished_at_unix_s is not None:
        msg.finished_at_unix_s = job.finished_at_unix_s
    if plan is not None:
        msg.plan.CopyFrom(plan_message(plan))
    if live is not None:
        msg.live.CopyFrom(live)
    if job.total_steps is not None:
        msg.total_steps = job.total_steps
    return msg


_PHASE_FIELDS = (
    "peak_memory_bytes",
    "data_s",
    "comm_wait_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "loss_sum",
    "samples",
    "switch_s",
    "busy_cv",
    "input_s",
    "input_cv",
)


def rank_stats_message(row: IntervalStatRow) -> tpb.RankIntervalStats:
    msg = tpb.RankIntervalStats(
        rank=row.rank, batch=row.batch, steps=row.steps, compute_s=row.compute_s, step_s=row.step_s
    )
    for field in _PHASE_FIELDS:
        value = getattr(row, field)
        if value is not None:
            setattr(msg, field, value)
    return msg


def interval_message(job_id: str, rows: Sequence[IntervalStatRow]) -> tpb.IntervalReport:
    """One stored interval (rows of one end_step, rank order) as a report."""
    msg = tpb.IntervalReport(
        job_id=job_id,
        end_step=rows[0].end_step if rows else 0,
        plan_version=rows[0].plan_version if rows else 0,
        ranks=[rank_stats_message(r) for r in rows],
    )
    if rows:
        msg.received_at_unix_s = max(r.received_at_unix_s for r in rows)
    return msg


def rank_phases(row: IntervalStatRow) -> throughput.RankPhases:
    return throughput.RankPhases(
        rank=row.rank,
        batch=row.batch,
        steps=row.steps,
        compute_s=row.compute_s,
        step_s=row.step_s,
        comm_wait_s=row.comm_wait_s,
        loss_sum=row.loss_sum,
        samples=row.samples,
    )


def job_live(
    job: JobRow, rows: Sequence[IntervalStatRow], stragglers: Sequence[StragglerEvidence]
) -> pb.JobLive | None:
    """``Job.live`` from the newest complete interval's rows; None before the first."""
    if not rows:
        return None
    est = throughput.estimate([rank_phases(r) for r in rows], job.global_batch)
    msg = pb.JobLive(
        end_step=rows[0].end_step,
        plan_version=rows[0].plan_version,
        ranks=[rank_stats_message(r) for r in rows],
        stragglers=[
            pb.StragglerFlag(rank=e.rank, ratio=e.ratio, intervals=e.intervals, message=e.message)
            for e in stragglers
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


def dry_run_job(
    spec: JobSpec,
    spec_yaml: str,
    placed: placement_mod.Placement,
    links: Sequence[Link] = (),
) -> pb.Job:
    """The job a submit would create, without storing it (``links``: those measured
    among its nodes, for its first plan)."""
    first = placement_mod.initial_plan(spec, placed, links)
    state = placement_mod.state_bytes(spec)
    return pb.Job(
        message=""
        if state is None
        else f"predicted peak memory per rank: {state / 2**30:.2f} GiB of sharded training "
        f"state (shard {spec.options.shard}) + activations, measured once it runs",
        name=spec.name,
        state=pb.JOB_STATE_UNSPECIFIED,
        policy=spec.policy,
        global_batch=spec.global_batch,
        world_size=spec.world_size,
        backend=placed.backend,
        master_addr=placed.master_addr,
        master_port=placed.master_port,
        spec_yaml=spec_yaml,
        ranks=[
            pb.RankPlacement(
                rank=r.rank,
                node_id=r.device.node_id,
                node_name=r.device.node_name,
                device_index=r.device.index,
                device_kind=KIND_TO_PB.get(r.device.kind, tpb.DEVICE_KIND_UNSPECIFIED),
                device_name=r.device.name,
                local_rank=r.local_rank,
                state=pb.RANK_STATE_UNSPECIFIED,
                emulated_slowdown=r.emulated_slowdown,
            )
            for r in placed.ranks
        ],
        plan=tpb.Plan(
            version=1,
            apply_at_step=0,
            batches=list(first.batches),
            policy=first.policy,
            reason=first.reason,
        ),
    )


def prediction_message(p: placement_mod.Prediction) -> pb.PolicyPrediction:
    return pb.PolicyPrediction(
        policy=p.policy,
        batches=list(p.batches),
        predicted_step_s=p.step_s,
        predicted_samples_per_s=p.samples_per_s,
        emulated=p.emulated,
        comm_s=p.comm_s,
    )


def interval_rows(report: tpb.IntervalReport) -> list[dict[str, Any]]:
    """A report's ranks as ``IntervalStatRow`` column values (plain dicts: the store
    inserts them in one statement, and an ORM object per rank cost more than that)."""
    return [
        {
            "rank": r.rank,
            "batch": r.batch,
            "steps": r.steps,
            "compute_s": r.compute_s,
            "step_s": r.step_s,
            "peak_memory_bytes": _opt(r, "peak_memory_bytes"),
            "data_s": _opt(r, "data_s"),
            "comm_wait_s": _opt(r, "comm_wait_s"),
            "forward_s": _opt(r, "forward_s"),
            "backward_s": _opt(r, "backward_s"),
            "optimizer_s": _opt(r, "optimizer_s"),
            "loss_sum": _opt(r, "loss_sum"),
            "samples": _opt(r, "samples"),
            "switch_s": _opt(r, "switch_s"),
            "busy_cv": _opt(r, "busy_cv"),
            "input_s": _opt(r, "input_s"),
            "input_cv": _opt(r, "input_cv"),
        }
        for r in report.ranks
    ]


def host_profile_text(profile: object | None) -> str:
    """A node's host profile as its column keeps it: protobuf JSON, "" for none."""
    if not isinstance(profile, tpb.HostProfile):
        return ""
    text: str = json_format.MessageToJson(profile, indent=None, preserving_proto_field_name=True)
    return text


def host_profile_of(text: str) -> tpb.HostProfile | None:
    """The column's host profile back (None for "" or a value no longer parsed)."""
    if not text:
        return None
    profile = tpb.HostProfile()
    try:
        json_format.Parse(text, profile, ignore_unknown_fields=True)
    except json_format.ParseError:
        return None
    return profile
