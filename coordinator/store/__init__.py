"""Store functions: the reads of the coordinator's tables that its state does not hold
(job pages, intervals, plans, events, logs of any age). The coordinator writes only
through its writer (``writer``, ``persist``); tools and tests that seed a database use
the same operations (``hetero.bench.seed``).

Each function takes a ``Session`` and never commits: its caller owns the transaction.
Times are Unix seconds passed in by the caller.
"""

from hetero.coordinator.store.events import job_events
from hetero.coordinator.store.intervals import (
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
    count_jobs,
    get_job,
    list_jobs,
)
from hetero.coordinator.store.logs import job_logs
from hetero.coordinator.store.plans import (
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
    "attempt_start_up_s",
    "complete_steps",
    "count_jobs",
    "get_job",
    "interval_history",
    "interval_steps",
    "job_events",
    "job_intervals",
    "job_logs",
    "job_plans",
    "latest_interval",
    "latest_plan",
    "latest_plans",
    "list_jobs",
    "plan_batches",
    "rank_interval",
]
