"""Orders in pages and rendezvous ports from the free set, on a real SQLite file (and,
for the pages, a real gRPC server): every order arrives exactly once, a job's
launches are never split, a page closes early when the caller's deadline is near,
the agent follows the pages, and no two placed jobs ever share a port."""

from __future__ import annotations

import random
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from hetero.agent.link import CoordinatorLink
from hetero.coordinator import lifecycle, orderpages, store
from hetero.coordinator.admission import Limits
from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.models import DeviceRow, JobRow
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
    object.__setattr__(coordinator.deps, "limits", Limits(ranks_per_cpu_device=1000))
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


def test_every_launch_arrives_once_in_pages_that_never_split_a_job(loaded) -> None:  # type: ignore[no-untyped-def]
    coordinator, node_id, jobs = loaded
    seen: list[tuple[str, int]] = []
    token, pages = "", 0
    while True:
        page = coordinator.stub.PollAssignments(
            pb.PollAssignmentsRequest(node_id=node_id, limit=20, page_token=token),
            timeout=DEADLINE_S,
        )
        pages += 1
        assert len(page.launches) <= 20
        per_job: dict[str, int] = {}
        for launch in page.launches:
            per_job[launch.job_id] = per_job.get(launch.job_id, 0) + 1
        assert all(per_job[j] == jobs[j] for j in per_job), "a job's launches split across pages"
        seen += [(o.job_id, o.rank) for o in page.launches]
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted((j, r) for j, n in jobs.items() for r in range(n))
    assert len(seen) == len(set(seen)) == 120 and pages >= 6
    with pytest.raises(grpc.RpcError) as info:
        coordinator.stub.PollAssignments(
            pb.PollAssignmentsRequest(node_id=node_id, page_token="L nope"), timeout=DEADLINE_S
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # Stops follow the launches, in the same pages.
    for job_id in list(jobs)[:3]:
        for rank in range(jobs[job_id]):
            coordinator.stub.ReportRankStatus(
                pb.ReportRankStatusRequest(
                    node_id=node_id, job_id=job_id, rank=rank, state=pb.RANK_STATE_RUNNING
                ),
                timeout=DEADLINE_S,
            )
        coordinator.stub.CancelJob(pb.CancelJobRequest(job_id=job_id), timeout=DEADLINE_S)
    stops, token = [], ""
    while True:
        page = coordinator.stub.PollAssignments(
            pb.PollAssignmentsRequest(node_id=node_id, limit=2, page_token=token),
            timeout=DEADLINE_S,
        )
        stops += [(o.job_id, o.rank) for o in page.stops]
        token = page.next_page_token
        if not token:
            break
    assert sorted(stops) == sorted((j, r) for j in list(jobs)[:3] for r in range(jobs[j]))


def test_a_page_closes_early_when_the_deadline_is_near_and_the_rest_follows(loaded) -> None:  # type: ignore[no-untyped-def]
    coordinator, node_id, _jobs = loaded
    sessions = session_factory(coordinator.engine)
    left = iter([10.0, 10.0, 0.2])  # the third job would start past the margin
    with sessions() as s:
        page = orderpages.poll_page(s, node_id, "", 100, lambda: next(left, 0.2))
    assert len({o.job_id for o in page.launches}) == 2 and page.next_page_token
    with sessions() as s:
        rest = orderpages.poll_page(s, node_id, page.next_page_token, 1000, lambda: None)
    got = [(o.job_id, o.rank) for o in [*page.launches, *rest.launches]]
    assert len(got) == len(set(got)) == 120 and not rest.next_page_token


def test_the_agent_follows_the_pages_into_one_set_of_orders(loaded) -> None:  # type: ignore[no-untyped-def]
    coordinator, node_id, _jobs = loaded
    link = CoordinatorLink.__new__(CoordinatorLink)  # only its stub and node id are used
    link.stub, link.node_id = coordinator.stub, node_id
    orders = link._poll_pages()
    assert len(orders.launches) == 120 and len({(o.job_id, o.rank) for o in orders.launches}) == 120


@pytest.mark.slow
def test_over_a_thousand_jobs_no_two_placed_jobs_share_a_rendezvous_port(tmp_path: Path) -> None:
    """1,050 jobs through the queue on 8 devices, ending in random order, with a span of 40
    ports: the old counter (jobs + restarts modulo the span) gave a placed job's port to
    every 40th job; here each placement checks the ports of every placed job."""
    engine = open_database(f"sqlite:///{tmp_path / 'c.db'}")
    sessions = session_factory(engine)
    cfg = store.QueueConfig(
        heartbeat_timeout_s=1e9, ranks_per_cpu_device=3, master_port_base=29500, master_port_span=40
    )
    rng = random.Random(7)
    now = 1_700_000_000.0
    with sessions.begin() as s:
        devices = [DeviceRow(index=i, name="cpu", kind="cpu", compute_score=1.0) for i in range(8)]
        node_id = store.register_node(
            s,
            name="n1",
            address="n1",
            agent_endpoint="",
            agent_version="",
            devices=devices,
            now=now,
        ).id
    specs = [(text, parse_jobspec(text)) for text in (_spec(f"j{i}", 1 + i % 3) for i in range(3))]
    placed = select(JobRow.master_port).where(JobRow.state.in_(lifecycle.PLACED))
    submitted, most, queued = 0, 0, 1
    for _ in range(400):  # passes: submitting for 105, then until the queue drains
        if submitted >= 1050 and not queued:
            break
        now += 1.0
        with sessions.begin() as s:
            for _ in range(10 if submitted < 1050 else 0):  # submissions since the last pass
                text, spec = specs[submitted % 3]
                s.add(store.new_job(spec, text, now=now, priority=0, owner="t"))
                submitted += 1
            running = store.list_jobs(s, [lifecycle.PENDING], 100_000)
            for done in rng.sample(running, k=min(len(running), rng.randint(6, 14))):
                for r in list(done.ranks):
                    store.set_rank_status(
                        s,
                        done.id,
                        r.rank,
                        node_id=node_id,
                        state=lifecycle.EXITED,
                        exit_code=0,
                        now=now,
                    )
            s.flush()
            store.admit_queued(s, cfg, now=now)
            s.flush()
            ports = list(s.scalars(placed))
            assert len(ports) == len(set(ports)), f"a port shared by placed jobs: {sorted(ports)}"
            assert all(29500 <= p < 29540 for p in ports)
            most = max(most, len(ports))
            queued = len(store.list_jobs(s, [lifecycle.QUEUED], 100_000))
    with sessions() as s:
        ran = len(store.list_jobs(s, [lifecycle.SUCCEEDED, *lifecycle.PLACED], 100_000))
    engine.dispose()
    assert ran == 1050, f"only {ran} of 1,050 jobs were placed"
    assert most >= 8, "many jobs were placed at once"
