"""``hetero-coord export``: a job's interval statistics and plans as CSV or JSON.

Pure formatting over ``JobDetail`` pages (the CLI fetches them). CSV is one
table per call (``intervals``: one row per interval and rank; ``plans``: one
row per plan) so it loads straight into pandas or a spreadsheet; JSON holds
the job, its plans and its intervals together. Units are in the column names;
an empty CSV cell (JSON null) is a value the trainer did not measure. States are
named as ``--json`` names them (``"SUCCEEDED"``: ``apijson``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from hetero.client.apijson import enum_short_name
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

TABLES = ("intervals", "plans")
FORMATS = ("csv", "json")

INTERVAL_COLUMNS = (
    "job_id",
    "end_step",
    "plan_version",
    "received_at_unix_s",
    "rank",
    "batch",
    "steps",
    "compute_s",
    "compute_s_per_sample",
    "step_s",
    "data_s",
    "forward_s",
    "backward_s",
    "comm_wait_s",
    "optimizer_s",
    "peak_memory_bytes",
    "loss_sum",
    "samples",
)
PLAN_COLUMNS = (
    "job_id",
    "version",
    "apply_at_step",
    "policy",
    "batches",
    "predicted_step_s",
    "reason",
)
_OPTIONAL = (
    "data_s",
    "forward_s",
    "backward_s",
    "comm_wait_s",
    "optimizer_s",
    "peak_memory_bytes",
    "loss_sum",
    "samples",
)


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def interval_records(intervals: Sequence[tpb.IntervalReport]) -> list[dict[str, Any]]:
    """One flat record per (interval, rank), oldest interval first."""
    out = []
    for iv in intervals:
        for r in iv.ranks:
            record: dict[str, Any] = {
                "job_id": iv.job_id,
                "end_step": iv.end_step,
                "plan_version": iv.plan_version,
                "received_at_unix_s": _opt(iv, "received_at_unix_s"),
                "rank": r.rank,
                "batch": r.batch,
                "steps": r.steps,
                "compute_s": r.compute_s,
                "compute_s_per_sample": r.compute_s / r.batch if r.batch > 0 else None,
                "step_s": r.step_s,
            }
            record.update({name: _opt(r, name) for name in _OPTIONAL})
            out.append(record)
    return out


def plan_records(plans: Sequence[tpb.Plan]) -> list[dict[str, Any]]:
    return [
        {
            "job_id": p.job_id,
            "version": p.version,
            "apply_at_step": p.apply_at_step,
            "policy": p.policy,
            "batches": list(p.batches),
            "predicted_step_s": _opt(p, "predicted_step_s"),
            "reason": p.reason,
        }
        for p in plans
    ]


def to_csv(records: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for rec in records:
        writer.writerow([_cell(rec.get(c)) for c in columns])
    return buf.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        # Batches stay one cell: "52 26 18" splits cleanly and needs no quoting.
        return " ".join(str(v) for v in value)
    return str(value)


def to_json(job: pb.Job, plans: Sequence[tpb.Plan], intervals: Sequence[tpb.IntervalReport]) -> str:
    doc = {
        "job": {
            "id": job.id,
            "name": job.name,
            "state": enum_short_name(pb.JobState.DESCRIPTOR, job.state),
            "policy": job.policy,
            "global_batch": job.global_batch,
            "world_size": job.world_size,
            "backend": job.backend,
            "emulated": any(r.emulated_slowdown not in (0.0, 1.0) for r in job.ranks),
            "ranks": [
                {
                    "rank": r.rank,
                    "node": r.node_name,
                    "device_index": r.device_index,
                    "device_name": r.device_name,
                    "emulated_slowdown": r.emulated_slowdown,
                }
                for r in job.ranks
            ],
        },
        "plans": plan_records(plans),
        "intervals": interval_records(intervals),
    }
    return json.dumps(doc, indent=2) + "\n"


def render(
    fmt: str,
    table: str,
    job: pb.Job,
    plans: Sequence[tpb.Plan],
    intervals: Sequence[tpb.IntervalReport],
) -> str:
    """The export text: JSON of everything, or the CSV ``table``."""
    if fmt == "json":
        return to_json(job, plans, intervals)
    if table == "plans":
        return to_csv(plan_records(plans), PLAN_COLUMNS)
    return to_csv(interval_records(intervals), INTERVAL_COLUMNS)
