"""The rules that change the coordinator's in-memory state (``coordinator.cluster``), with
no database: a job placed or queued, the queue moving when devices free, a failed rank
restarting the job on what is left, a silent node lost, each change collecting the
write operations and the nodes whose orders it changed, and the orders a node's stream
sends (``coordinator.orders``)."""

from __future__ import annotations

from hetero.coordinator import lifecycle
from hetero.coordinator.cluster import Cluster, NotFoundError, Rules
from hetero.coordinator.orders import OrderStream
from hetero.coordinator.persist import SaveJob
from hetero.coordinator.state import ClusterState, Device
from hetero.core.jobspec import parse_jobspec

T0 = 1_000.0
SPEC = """\
name: {name}
model: simple_cnn
global_batch: 64
steps: 100
policy: dynamic
max_restarts: {restarts}
resources:
  ranks: {ranks}
  device: cpu
"""


def _cluster(nodes: int = 2) -> Cluster:
    cluster = Cluster(
        ClusterState(), Rules(heartbeat_timeout_s=10.0, started_at=T0, ranks_per_cpu_device=1)
    )
    for i in range(nodes):
        cluster.register(
            name=f"n{i}",
            address=f"n{i}.local",
            agent_endpoint="",
            agent_version="test",
            devices=(Device(0, "cpu", "cpu", 1.0),),
            now=T0,
        )
    cluster.take()
    return cluster


def _submit(cluster: Cluster, name: str, ranks: int, now: float, restarts: int = 0):  # type: ignore[no-untyped-def]
    text = SPEC.format(name=name, ranks=ranks, restarts=restarts)
    return cluster.submit(
        parse_jobspec(text, source="job.yaml"), text, now=now, priority=0, owner="ana"
    )


def test_a_job_that_fits_is_placed_with_its_first_plan_and_one_that_does_not_waits() -> None:
    cluster = _cluster(nodes=2)
    first, placed = _submit(cluster, "first", 2, T0 + 1)
    assert placed is not None and first.state == lifecycle.PENDING
    assert first.plan is not None and first.plan.batches == (32, 32) and first.plan.version == 1
    assert [e.kind for e in first.events] == ["job_submitted"]
    ops, touched = cluster.take()
    assert touched == set(cluster.state.nodes), "both nodes get launch orders"
    assert any(isinstance(op, SaveJob) and op.values["state"] == "PENDING" for op in ops)
    second, placed = _submit(cluster, "second", 1, T0 + 2)
    assert placed is None and second.state == lifecycle.QUEUED
    assert second.message.startswith("waiting for 1 CPU slot")
    before = cluster.capacity
    cluster.cancel(first.id, now=T0 + 3)
    assert cluster.capacity > before, "a cancel frees devices: the service's pass is due"
    cluster.place_waiting(now=T0 + 3)  # the pass the service's admission task runs
    assert second.state == lifecycle.PENDING, "a cancel frees devices and the queue moves"
    assert first.ranks[0].state == lifecycle.EXITED, "a rank never started is simply dropped"
    assert cluster.state.ports_in_use() == {second.master_port}


def test_a_failed_rank_restarts_the_job_once_the_survivor_has_stopped() -> None:
    cluster = _cluster(nodes=2)
    job, _ = _submit(cluster, "resilient", 2, T0 + 1, restarts=1)
    for r in job.ranks:
        cluster.rank_status(
            job.id, r.rank, node_id=r.node_id, state=lifecycle.RUNNING, exit_code=None, now=T0 + 2
        )
    assert job.state == lifecycle.RUNNING
    failed, survivor = job.ranks
    cluster.take()
    cluster.rank_status(
        job.id, 0, node_id=failed.node_id, state=lifecycle.EXITED, exit_code=1, now=T0 + 3
    )
    assert job.state == lifecycle.RESTARTING and survivor.state == lifecycle.STOPPING
    assert "rank 0 exited with code 1" in job.message
    _, touched = cluster.take()
    assert survivor.node_id in touched, "the survivor's node gets its stop order"
    old_port = job.master_port
    cluster.rank_status(
        job.id, 1, node_id=survivor.node_id, state=lifecycle.EXITED, exit_code=143, now=T0 + 4
    )
    assert job.state == lifecycle.PENDING and job.restarts == 1
    assert job.plan is not None and job.attempt_first_plan == job.plan.version == 2
    assert job.master_port != old_port and all(r.state == lifecycle.ASSIGNED for r in job.ranks)
    stale = cluster.rank_status(
        job.id,
        0,
        node_id=failed.node_id,
        state=lifecycle.EXITED,
        exit_code=1,
        now=T0 + 5,
        attempt=0,
    )
    assert stale.state == lifecycle.PENDING, "news of an earlier attempt changes nothing"


def test_a_silent_node_is_lost_and_its_job_restarts_on_fewer_ranks() -> None:
    cluster = _cluster(nodes=2)
    job, _ = _submit(cluster, "shrinks", 2, T0 + 1, restarts=2)
    for r in job.ranks:
        cluster.rank_status(
            job.id, r.rank, node_id=r.node_id, state=lifecycle.RUNNING, exit_code=None, now=T0 + 2
        )
    quiet = cluster.state.node_named("n1")
    assert quiet is not None
    cluster.heartbeat(cluster.state.node_named("n0").id, T0 + 30)  # type: ignore[union-attr]
    cluster.sweep(now=T0 + 30)
    assert quiet.down and job.state == lifecycle.RESTARTING
    lost, survivor = sorted(job.ranks, key=lambda r: r.node_id != quiet.id)
    assert lost.state == lifecycle.EXITED, "a rank on a node that is down is gone at once"
    assert survivor.state == lifecycle.STOPPING
    cluster.rank_status(
        job.id,
        survivor.rank,
        node_id=survivor.node_id,
        state=lifecycle.EXITED,
        exit_code=143,
        now=T0 + 31,
    )
    assert [e.kind for e in job.events][-1] == "job_restarted"
    assert job.state == lifecycle.PENDING and job.world_size == 1
    assert job.plan is not None and job.plan.batches == (64,), "the same global batch"
    cluster.heartbeat(quiet.id, T0 + 31)
    assert not quiet.down, "heard again: up"


def test_a_lost_node_is_told_it_should_run_none_of_its_ranks_though_no_stop_is_ordered() -> None:
    """A node declared down gets no stop order (its ranks count as gone at once); the
    wanted ranks its stream sends then lack them, so its agent, if it comes back,
    stops them itself."""
    cluster = _cluster(nodes=2)
    job, _ = _submit(cluster, "moves", 2, T0 + 1, restarts=1)
    quiet = cluster.state.node_named("n1")
    loud = cluster.state.node_named("n0")
    assert quiet is not None and loud is not None
    streams = {n.id: OrderStream(n.id) for n in (quiet, loud)}
    for r in job.ranks:
        cluster.rank_status(
            job.id, r.rank, node_id=r.node_id, state=lifecycle.RUNNING, exit_code=None, now=T0 + 2
        )
    (first,) = streams[quiet.id].new(cluster.state, T0 + 2)
    lost = next(r for r in job.ranks if r.node_id == quiet.id)
    assert first.complete and not first.launches
    assert [(w.job_id, w.rank, w.attempt) for w in first.wanted.ranks] == [(job.id, lost.rank, 0)]
    assert streams[quiet.id].new(cluster.state, T0 + 3) == [], "nothing changed: nothing sent"
    streams[loud.id].new(cluster.state, T0 + 3)

    cluster.heartbeat(loud.id, T0 + 30)
    cluster.sweep(now=T0 + 30)
    assert quiet.down and job.state == lifecycle.RESTARTING
    (told,) = streams[quiet.id].new(cluster.state, T0 + 30)
    assert not told.launches and not told.stops, "no stop order for a lost node"
    assert told.complete and told.HasField("wanted") and not told.wanted.ranks
    (survivor,) = streams[loud.id].new(cluster.state, T0 + 30)
    assert len(survivor.stops) == 1 and not survivor.wanted.ranks


def test_unknown_jobs_and_nodes_are_not_found() -> None:
    cluster = _cluster(nodes=1)
    for call in (
        lambda: cluster.cancel("nope", now=T0),
        lambda: cluster.heartbeat("nope", T0),
        lambda: cluster.drain("nope", True, now=T0),
    ):
        try:
            call()
        except NotFoundError:
            continue
        raise AssertionError("NotFoundError expected")


def test_a_job_that_succeeded_shows_its_last_step_though_its_last_interval_was_short() -> None:
    """A 100-step job reporting every 30 steps last reported step 90; once every rank
    exited 0 it ran all 100 (issue #34: hetero-top showed 'step 70/72' for a finished job)."""
    cluster = _cluster()
    job, _ = _submit(cluster, "done", 2, T0)
    job.last_step = 90
    for r in job.ranks:
        cluster.rank_status(
            job.id, r.rank, node_id=r.node_id, state=lifecycle.RUNNING, exit_code=None, now=T0 + 1
        )
    for r in job.ranks:
        cluster.rank_status(
            job.id, r.rank, node_id=r.node_id, state=lifecycle.EXITED, exit_code=0, now=T0 + 2
        )
    assert job.state == lifecycle.SUCCEEDED and job.last_step == 100
