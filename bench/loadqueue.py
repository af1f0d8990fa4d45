"""The queue of ``hetero-bench load --queued N``: N jobs that wait QUEUED for the whole run.

Each queued job asks for every device of the simulated cluster, so while the
load's own jobs run it cannot be placed: the head of the queue waits for devices
that are busy, and the rest wait behind it, as a batch system's queue does when
its users submit more than the cluster holds. What the run then measures is the
coordinator's steady state with a long queue: every admission pass (the
sweeper's, each registration's and each rank exit's) and every per-call path
must cost the same with 10,000 jobs waiting as with none.

Why the rows are written through the store and not submitted with ``SubmitJob``:
a submission runs an admission pass over every registered device (4,000 for
1,000 agents), so 10,000 submissions took many minutes to set up a figure that is
about the steady state, not the submission rate; and one credential may hold at
most ``Limits.jobs_per_user`` (1,000) jobs. The rows are the ones ``SubmitJob``
stores for a job that waits (``store.new_job``), written in one transaction while
the coordinator runs (SQLite takes a second writer; the coordinator's next
admission pass gives each head job its reason).
"""

from __future__ import annotations

import time

from hetero.bench.loadconfig import LoadConfig, LoadError

#: Rows written per transaction: one transaction for 10,000 would hold SQLite's write
#: lock for long enough to stall the coordinator's heartbeat flushes.
BATCH = 500

QUEUED_SPEC = """\
name: queued-{index}
model: debug
global_batch: {global_batch}
steps: 1000
policy: dynamic
resources:
  ranks: {world_size}
  device: cuda
"""


def queued_world_size(config: LoadConfig) -> int:
    """Ranks a queued job asks for: every device the simulated agents have."""
    return config.agents * config.devices_per_agent


def queue_jobs(db_url: str, config: LoadConfig) -> int:
    """Write ``config.queued`` QUEUED jobs into the coordinator's database at ``db_url``
    (schema already created by the running coordinator); returns how many."""
    from hetero.coordinator import store
    from hetero.coordinator.database import connect, session_factory
    from hetero.coordinator.identity import ANYONE
    from hetero.core.jobspec import parse_jobspec

    world = queued_world_size(config)
    if world <= config.ranks:
        raise LoadError("--queued: the cluster has no device beyond the running ranks")
    engine = connect(db_url)
    sessions = session_factory(engine)
    try:
        written = 0
        while written < config.queued:
            with sessions.begin() as s:
                for i in range(written, min(config.queued, written + BATCH)):
                    spec_yaml = QUEUED_SPEC.format(index=i, global_batch=world, world_size=world)
                    spec = parse_jobspec(spec_yaml, source=f"queued job {i}")
                    # Distinct submission times keep the queue's order the insertion order.
                    now = time.time() + i * 1e-6
                    s.add(store.new_job(spec, spec_yaml, now=now, priority=0, owner=ANYONE))
            written = min(config.queued, written + BATCH)
        return written
    finally:
        engine.dispose()
