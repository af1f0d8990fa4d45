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
stores for a job that waits (``store.new_job``), written in transactions of
:data:`BATCH` while the coordinator runs (SQLite takes a second writer), under an
owner of their own (:data:`OWNER`). The last job is submitted with ``SubmitJob``:
its admission pass gives the head of the queue its reason, and the coordinator,
which cannot see another process's writes (``coordinator.capacity``), sees a
submission as it would any user's.
"""

from __future__ import annotations

import time

from hetero.bench.loadconfig import LoadConfig, LoadError

#: The owner of the rows written through the store: the load's own submissions (no
#: credential) stay within ``Limits.jobs_per_user``.
OWNER = "load-queue"
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


def queue_jobs(db_url: str, address: str, config: LoadConfig) -> int:
    """Queue ``config.queued`` jobs in the coordinator at ``address`` with the database at
    ``db_url`` (schema already created by it): all but the last written through the
    store, the last submitted; returns how many."""
    from hetero.coordinator import store
    from hetero.coordinator.database import connect, session_factory
    from hetero.core.jobspec import parse_jobspec

    world = queued_world_size(config)
    if world <= config.ranks:
        raise LoadError("--queued: the cluster has no device beyond the running ranks")
    if config.queued == 0:
        return 0
    written, rows = 0, config.queued - 1
    engine = connect(db_url)
    sessions = session_factory(engine)
    try:
        while written < rows:
            with sessions.begin() as s:
                for i in range(written, min(rows, written + BATCH)):
                    spec_yaml = _spec(i, world)
                    spec = parse_jobspec(spec_yaml, source=f"queued job {i}")
                    # Distinct submission times keep the queue's order the insertion order.
                    now = time.time() + i * 1e-6
                    s.add(store.new_job(spec, spec_yaml, now=now, priority=0, owner=OWNER))
            written = min(rows, written + BATCH)
    finally:
        engine.dispose()
    _submit_last(address, _spec(rows, world))
    return config.queued


def _spec(index: int, world: int) -> str:
    return QUEUED_SPEC.format(index=index, global_batch=world, world_size=world)


def _submit_last(address: str, spec_yaml: str) -> None:
    import grpc

    from hetero.security.transport import remote_error
    from hetero.v1 import coordinator_pb2 as pb
    from hetero.v1 import coordinator_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
        try:
            job = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec_yaml), timeout=60.0).job
        except grpc.RpcError as exc:
            where = f"the coordinator at {address}"
            raise LoadError(f"submitting the last queued job: {remote_error(exc, where)}") from None
    if job.state != pb.JOB_STATE_QUEUED:
        raise LoadError(f"the last queued job was not queued: {pb.JobState.Name(job.state)}")
