"""Rows for a database before a coordinator starts, written with the coordinator's own
write operations (``coordinator.persist``), as its writer writes them.

The load benchmark's queue and ``listjobs`` need thousands of jobs in the store before
the coordinator loads them (its recovery); submitting them one by one would measure
the submission, not the steady state. What is written here is what ``SubmitJob``
would have left: the job's row as ``cluster.Cluster.submit`` makes the job, saved by
``persist.save_job``. Tests that seed a store use it too, and its interval rows.
"""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle, persist
from hetero.coordinator.models import IntervalStatRow
from hetero.coordinator.state import Device, Interval, Job, Node
from hetero.coordinator.writer import Op
from hetero.core.jobspec import JobSpec


def queued_job(spec: JobSpec, spec_yaml: str, *, now: float, priority: int, owner: str) -> Job:
    """A job as ``SubmitJob`` queues it: QUEUED, no ranks, no plan yet."""
    return Job(
        id=uuid.uuid4().hex[:12],
        name=spec.name,
        spec=spec,
        spec_yaml=spec_yaml,
        state=lifecycle.QUEUED,
        submitted_at_unix_s=now,
        world_size=spec.world_size,
        priority=priority,
        owner=owner,
    )


def cpu_node(name: str, devices: int, *, now: float) -> Node:
    """A registered node of ``devices`` CPU devices of compute score 1, heard at ``now``."""
    return Node(
        id=uuid.uuid4().hex[:12],
        name=name,
        address=name,
        agent_endpoint="",
        agent_version="",
        registered_at_unix_s=now,
        last_heartbeat_unix_s=now,
        devices=tuple(
            Device(index=i, name=f"cpu{i}", kind="cpu", compute_score=1.0) for i in range(devices)
        ),
    )


def save(s: Session, *ops: Op) -> None:
    """Apply ``ops`` in ``s``'s transaction, as the writer applies a batch."""
    for op in ops:
        op.apply(s)


def interval_rows(
    job_id: str, interval: Interval, plan_version: int, now: float
) -> persist.AddRows:
    """One complete interval's rows as the balancer sees them, received at ``now``
    (reports store their full statistics, ``wire.interval_rows``)."""
    end_step, ranks = interval
    rows = tuple(
        {
            "job_id": job_id,
            "end_step": end_step,
            "plan_version": plan_version,
            "received_at_unix_s": now,
            "rank": r.rank,
            "batch": r.batch,
            "steps": r.steps,
            "compute_s": r.compute_s,
            "step_s": r.step_s,
            "peak_memory_bytes": r.peak_memory_bytes,
            "data_s": r.data_s,
            "optimizer_s": r.optimizer_s,
            "switch_s": r.switch_s,
            "busy_cv": r.busy_cv,
            "input_s": r.input_s,
            "input_cv": r.input_cv,
        }
        for r in ranks
    )
    return persist.AddRows(IntervalStatRow, rows)
