"""Orders pushed on each agent's stream over a real gRPC server, and rendezvous ports from
the free set: every order arrives once, a job's launches are never split across
messages, only what changes is pushed next, the agent's stream opens again after the
coordinator restarts, and no two placed jobs ever share a port."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest

from hetero.agent.link import CoordinatorLink, OrderStream
from hetero.coordinator import lifecycle
from hetero.coordinator.admission import Limits
from hetero.coordinator.cluster import Cluster, Rules
from hetero.coordinator.state import ClusterState, Device
from hetero.core.jobspec import parse_jobspec
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0


def _spec(name: str, ranks: int) -> str:
    return (
        f"name: {name}\nglobal_batch: 32\nsteps: 10\nresources:\n  ranks: {ranks}\n  device: cpu\n"
    )


@pytest.fixture
def loaded(coordinator):  # type: ignore[no-untyped-def]
    """A node of one CPU device holding 60 placed jobs (1 or 3 ranks), 150 ranks in all."""
    coordinator.reconfigure(limits=Limits(ranks_per_cpu_device=1000))
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    node_id = coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(name="n1", address="n1.local", devices=[device]), timeout=DEADLINE_S
    ).node_id
    jobs = {}
    for n in range(60):
        coordinator.clock.now += 0.1
        spec = _spec(f"j{n}", 3 if n % 2 else 1)
        job = coordinator.stub.SubmitJob(
            pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S
        ).job
        assert job.state == pb.JOB_STATE_PENDING
        jobs[job.id] = job.world_size
    return coordinator, node_id, jobs


def test_every_order_is_pushed_once_in_messages_that_never_split_a_job(loaded) -> None:  # type: ignore[no-untyped-def]
    coordinator, node_id, jobs = loaded
    call = coordinator.stub.WatchOrders(pb.WatchOrdersRequest(node_id=node_id), timeout=30)
    seen: list[tuple[str, int]] = []
    for msg in call:
        per_job: dict[str, int] = {}
        for launch in msg.launches:
            per_job[launch.job_id] = per_job.get(launch.job_id, 0) + 1
        assert all(per_job[j] == jobs[j] for j in per_job), "a job's launches split"
        seen += [(o.job_id, o.rank) for o in msg.launches]
        if msg.complete:
            break
    assert len(seen) == len(set(seen)) == 120
    # Then only what changes: the first job cancelled while its ranks run is three stops.
    first = next(j for j, n in jobs.items() if n == 3)
    for rank in range(3):
        coordinator.stub.ReportRankStatus(
            pb.ReportRankStatusRequest(
                node_id=node_id, job_id=first, rank=rank, state=pb.RANK_STATE_RUNNING
            ),
            timeout=DEADLINE_S,
        )
    coordinator.stub.CancelJob(pb.CancelJobRequest(job_id=first), timeout=DEADLINE_S)
    pushed = next(call)
    assert not pushed.launches and [(o.job_id, o.rank) for o in pushed.stops] == [
        (first, r) for r in range(3)
    ]
    assert pushed.complete and pushed.stops[0].reason == "cancelled by user"
    call.cancel()


def test_the_agents_stream_opens_again_after_a_coordinator_restart(loaded) -> None:  # type: ignore[no-untyped-def]
    coordinator, node_id, _jobs = loaded
    link = CoordinatorLink.__new__(CoordinatorLink)  # only its stub, node id and config are used
    link.stub, link.node_id = coordinator.stub, node_id
    link.config = SimpleNamespace(coordinator=coordinator.address)  # type: ignore[assignment]
    stream = OrderStream(link)
    stream.start()
    try:
        assert len(_launches(stream, 120)) == 120
        coordinator.restart()
        link.stub = coordinator.stub
        # The stream retries with a backoff capped at ``max_s``: under load the restart
        # can outlast several doublings, so the new stream may open that late.
        again = _launches(stream, 120, wait_s=30 + stream.backoff.max_s)
        assert len(again) == 120, "every order not confirmed, once more on the new stream"
    finally:
        stream.stop()


def _launches(stream: OrderStream, want: int, wait_s: float = 30) -> set[tuple[str, int]]:
    got: set[tuple[str, int]] = set()
    deadline = time.monotonic() + wait_s
    while len(got) < want and time.monotonic() < deadline:
        for orders in stream.take():
            got |= {(o.job_id, o.rank) for o in orders.launches}
        time.sleep(0.05)
    return got


def test_over_a_thousand_jobs_no_two_placed_jobs_share_a_rendezvous_port() -> None:
    """1,050 jobs through the queue on 8 devices, ending in random order, with a span of 40
    ports: the old counter (jobs + restarts modulo the span) gave a placed job's port to
    every 40th job; here each placement checks the ports of every placed job."""
    rules = Rules(
        heartbeat_timeout_s=1e9,
        started_at=0.0,
        ranks_per_cpu_device=3,
        master_port_base=29500,
        master_port_span=40,
    )
    cluster = Cluster(ClusterState(), rules)
    rng = random.Random(7)
    now = 1_700_000_000.0
    devices = tuple(Device(i, "cpu", "cpu", 1.0) for i in range(8))
    node = cluster.register(
        name="n1", address="n1", agent_endpoint="", agent_version="", devices=devices, now=now
    )
    specs = [(text, parse_jobspec(text)) for text in (_spec(f"j{i}", 1 + i % 3) for i in range(3))]
    submitted, most = 0, 0
    for _ in range(400):  # passes: submitting for 105, then until the queue drains
        if submitted >= 1050 and not cluster.state.queued():
            break
        now += 1.0
        for _ in range(10 if submitted < 1050 else 0):  # submissions since the last pass
            text, spec = specs[submitted % 3]
            cluster.submit(spec, text, now=now, priority=0, owner="t")
            submitted += 1
        running = [j for j in cluster.state.jobs.values() if j.state == lifecycle.PENDING]
        for done in rng.sample(running, k=min(len(running), rng.randint(6, 14))):
            for r in list(done.ranks):
                cluster.rank_status(
                    done.id, r.rank, node_id=node.id, state=lifecycle.EXITED, exit_code=0, now=now
                )
        cluster.admit(now=now)
        ports = [j.master_port for j in cluster.state.placed_jobs()]
        assert len(ports) == len(set(ports)), f"a port shared by placed jobs: {sorted(ports)}"
        assert all(29500 <= p < 29540 for p in ports)
        most = max(most, len(ports))
        cluster.take()
    ran = sum(
        j.state in (lifecycle.SUCCEEDED, *lifecycle.PLACED) for j in cluster.state.jobs.values()
    )
    assert ran == 1050, f"only {ran} of 1,050 jobs were placed"
    assert most >= 8, "many jobs were placed at once"
