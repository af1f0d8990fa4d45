"""The queue of ``hetero-bench load --queued N``: N jobs that wait QUEUED for the whole run.

Each queued job asks for one rank more than the simulated cluster has devices, so no
admission pass can ever place it: the head of the queue waits and holds every device
it may use, and the rest wait behind it, as a batch system's queue does when its users
submit more than the cluster holds. (Asking for exactly every device, a queued job was
placed the moment the last agent registered, before the load's own jobs.) What the
run then measures is the coordinator's steady state with a long queue: every admission
pass (the sweeper's, each registration's and each rank exit's) and every per-call path
must cost the same with 10,000 jobs waiting as with none.

The rows are the ones ``SubmitJob`` stores for a job that waits (``seed.queued_job``),
written under an owner of their own (:data:`OWNER`) before the coordinator starts,
which loads them as it does after a restart (its recovery: each spec parsed once):
10,000 submissions took minutes to set up a figure that is about the steady state, not
the submission rate, and a submission of a job that could never fit is refused. They
have priority :data:`PRIORITY`, below the load's own jobs, which are placed ahead of
them.
"""

from __future__ import annotations

import time

from hetero.bench.loadconfig import LoadConfig

#: The owner of the rows written before the coordinator starts: the load's own submissions (no
#: credential) stay within ``Limits.jobs_per_user``.
OWNER = "load-queue"
#: Rows written per transaction.
BATCH = 500
#: The queued jobs' priority: below the load's own jobs (0), which run ahead of them.
PRIORITY = -1

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
    """Ranks a queued job asks for: one more than the simulated agents have devices."""
    return config.agents * config.devices_per_agent + 1


def write_queued(db_url: str, config: LoadConfig) -> int:
    """Write ``config.queued`` queued jobs to the database at ``db_url`` (its schema created
    here), before the coordinator starts; how many."""
    from hetero.bench import seed
    from hetero.coordinator import persist
    from hetero.coordinator.database import open_database, session_factory
    from hetero.core.jobspec import parse_jobspec

    world = queued_world_size(config)
    written, rows = 0, config.queued
    engine = open_database(db_url)
    sessions = session_factory(engine)
    try:
        while written < rows:
            with sessions.begin() as s:
                for i in range(written, min(rows, written + BATCH)):
                    spec_yaml = _spec(i, world)
                    spec = parse_jobspec(spec_yaml, source=f"queued job {i}")
                    # Distinct submission times keep the queue's order the insertion order.
                    now = time.time() + i * 1e-6
                    job = seed.queued_job(spec, spec_yaml, now=now, priority=PRIORITY, owner=OWNER)
                    seed.save(s, persist.save_job(job))
            written = min(rows, written + BATCH)
    finally:
        engine.dispose()
    return written


def _spec(index: int, world: int) -> str:
    return QUEUED_SPEC.format(index=index, global_batch=world, world_size=world)
