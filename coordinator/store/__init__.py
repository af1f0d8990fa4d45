"""Store functions: every read and write of the coordinator's tables.

Each function takes a ``Session`` and never commits: the RPC handler that
opened the session owns the transaction, so one request is one transaction.
Times are Unix seconds passed in by the caller (the clock is injectable).

One module per table group; callers use the package (``store.get_job(s, ...)``),
which names every public function:

- ``nodes``: registration, draining, liveness and the device slots for placement;
- ``telemetry``: heartbeats in bulk and downsampled telemetry;
- ``jobs``: submission, cancel, rank states through the lifecycle, restarts;
- ``queue``: jobs waiting for devices and the pass that places them;
- ``ports``: each placed job's own rendezvous port;
- ``orders``: the ranks an agent should launch or stop;
- ``plans``: a job's per-rank batches by version;
- ``intervals``: per-rank interval statistics and the balancer's windows;
- ``events`` and ``logs``: the event journal and the ranks' log lines.
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
    active_jobs_on_node,
    apply_transition,
    cancel_job,
    count_jobs,
    create_job,
    fail_restart,
    get_job,
    list_jobs,
    lose_node,
    new_job,
    place_job,
    replace_job,
    restart_without,
    restarting_jobs,
    set_rank_status,
)
from hetero.coordinator.store.logs import append_logs, job_logs
from hetero.coordinator.store.nodes import (
    device_slots,
    find_node,
    get_node,
    is_healthy,
    list_nodes,
    mark_down,
    register_node,
    set_draining,
    silent_nodes,
)
from hetero.coordinator.store.orders import nodes_with_orders, ranks_to_launch, ranks_to_stop
from hetero.coordinator.store.plans import (
    add_plan,
    job_plans,
    latest_plan,
    latest_plans,
    plan_batches,
)
from hetero.coordinator.store.ports import PortsExhaustedError, free_port, free_ports, ports_in_use
from hetero.coordinator.store.queue import (
    QueueConfig,
    admit_queued,
    ahead_of,
    enqueue,
    jobs_of,
    queued_ids,
    spec_of,
)
from hetero.coordinator.store.rows import NotFoundError
from hetero.coordinator.store.telemetry import (
    Beat,
    TelemetryPolicy,
    latest_telemetry,
    latest_telemetry_of,
    record_heartbeats,
)

__all__ = [
    "Beat",
    "JobKey",
    "NotFoundError",
    "PortsExhaustedError",
    "QueueConfig",
    "TelemetryPolicy",
    "active_jobs_on_node",
    "add_event",
    "add_interval",
    "add_plan",
    "admit_queued",
    "ahead_of",
    "append_logs",
    "apply_transition",
    "attempt_start_up_s",
    "cancel_job",
    "complete_steps",
    "count_jobs",
    "create_job",
    "device_slots",
    "enqueue",
    "fail_restart",
    "find_node",
    "free_port",
    "free_ports",
    "get_job",
    "get_node",
    "interval_history",
    "interval_steps",
    "is_healthy",
    "job_events",
    "job_intervals",
    "job_logs",
    "job_plans",
    "jobs_of",
    "last_event_message",
    "latest_interval",
    "latest_plan",
    "latest_plans",
    "latest_telemetry",
    "latest_telemetry_of",
    "list_jobs",
    "list_nodes",
    "lose_node",
    "mark_down",
    "new_job",
    "nodes_with_orders",
    "place_job",
    "plan_batches",
    "ports_in_use",
    "queued_ids",
    "rank_interval",
    "ranks_to_launch",
    "ranks_to_stop",
    "record_heartbeats",
    "register_node",
    "replace_job",
    "restart_without",
    "restarting_jobs",
    "set_draining",
    "set_rank_status",
    "silent_nodes",
    "spec_of",
]
