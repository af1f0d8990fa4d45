"""Store functions: the reads of the coordinator's tables that its state does not hold
(job pages, intervals, plans, events, logs of any age), the rows of a job as
``SubmitJob`` stores it, and the row-level writes tools and tests seed a database with.
The coordinator itself writes through its writer (``writer``, ``persist``).

Each function takes a ``Session`` and never commits: its caller owns the transaction.
Times are Unix seconds passed in by the caller.
"""

from hetero.coordinator.store.events import add_event, job_events, last_event_message
from hetero.coordinator.store.intervals import (
    add_interval,
    attempt_start_up_s,
    complete_steps,
    interval_history,
    interval_steps,
    job_intervals,
    latest_interval,
    rank_interval,
)
from hetero.coordinator.store.jobs import (
    JobKey,
    apply_transition,
    cancel_job,
    count_jobs,
    create_job,
    get_job,
    list_jobs,
    new_job,
    place_job,
    set_rank_status,
)
from hetero.coordinator.store.logs import append_logs, job_logs
from hetero.coordinator.store.nodes import device_slots, register_node
from hetero.coordinator.store.plans import (
    add_plan,
    job_plans,
    latest_plan,
    latest_plans,
    plan_batches,
)
from hetero.coordinator.store.rows import NotFoundError
from hetero.coordinator.store.telemetry import TelemetryPolicy

__all__ = [
    "JobKey",
    "NotFoundError",
    "TelemetryPolicy",
    "add_event",
    "add_interval",
    "add_plan",
    "append_logs",
    "apply_transition",
    "attempt_start_up_s",
    "cancel_job",
    "complete_steps",
    "count_jobs",
    "create_job",
    "device_slots",
    "get_job",
    "interval_history",
    "interval_steps",
    "job_events",
    "job_intervals",
    "job_logs",
    "job_plans",
    "last_event_message",
    "latest_interval",
    "latest_plan",
    "latest_plans",
    "list_jobs",
    "new_job",
    "place_job",
    "plan_batches",
    "rank_interval",
    "register_node",
    "set_rank_status",
]
