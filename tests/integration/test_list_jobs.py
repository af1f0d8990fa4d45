"""Listing jobs with many in the store, over real gRPC and a real SQLite file: ListJobs
in pages (newest first, each job once, a token that goes on), a page read in a fixed
number of queries however many jobs it holds, ``hetero-coord jobs --limit/--all`` with
each job's owner, and a cluster snapshot (hetero-top) that a flood of queued jobs does
not push a running job out of."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from sqlalchemy import event

from hetero.bench import seed
from hetero.coordinator import messages, persist
from hetero.core.jobspec import parse_jobspec
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 10.0
QUEUED = "name: flood\nglobal_batch: 8\nsteps: 5\nresources: {ranks: 1, device: cpu}\n"


def _flood(coordinator, n: int, owner: str = "user:ana") -> list[str]:  # type: ignore[no-untyped-def]
    """``n`` queued jobs written to the store (as a flood of submissions leaves them),
    one a second before the clock's now, and the coordinator restarted to load them;
    their ids, newest first."""
    spec = parse_jobspec(QUEUED, source="flood")
    ids = []
    with coordinator.sessions.begin() as s:
        for i in range(n):
            job = seed.queued_job(
                spec, QUEUED, now=coordinator.clock.now - n + i, priority=0, owner=owner
            )
            seed.save(s, persist.save_job(job))
            ids.append(job.id)
    coordinator.restart()
    return ids[::-1]


@contextmanager
def _statements(coordinator) -> Iterator[list[str]]:  # type: ignore[no-untyped-def]
    """The SQL statements the coordinator's engine runs inside the block."""
    seen: list[str] = []

    def count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        seen.append(statement)

    event.listen(coordinator.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(coordinator.engine, "before_cursor_execute", count)


def test_list_jobs_pages_newest_first_each_job_once_with_the_total(coordinator) -> None:  # type: ignore[no-untyped-def]
    ids = _flood(coordinator, 250)
    first = coordinator.stub.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
    assert len(first.jobs) == 100 and first.total == 250 and first.next_page_token
    assert first.jobs[0].owner == "user:ana"
    seen, token = [], ""
    while True:
        page = coordinator.stub.ListJobs(
            pb.ListJobsRequest(limit=40, page_token=token), timeout=DEADLINE_S
        )
        assert len(page.jobs) <= 40
        seen += [j.id for j in page.jobs]
        token = page.next_page_token
        if not token:
            break
    assert seen == ids, "newest first, every job once"
    with pytest.raises(grpc.RpcError) as bad:
        coordinator.stub.ListJobs(pb.ListJobsRequest(page_token="nope"), timeout=DEADLINE_S)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.details() == "page_token: not a token of this coordinator: 'nope'"


def test_a_page_of_jobs_costs_the_same_queries_however_many_it_holds(coordinator) -> None:  # type: ignore[no-untyped-def]
    _flood(coordinator, 300)
    with _statements(coordinator) as small:
        coordinator.stub.ListJobs(pb.ListJobsRequest(limit=10), timeout=DEADLINE_S)
    with _statements(coordinator) as large:
        coordinator.stub.ListJobs(pb.ListJobsRequest(limit=300), timeout=DEADLINE_S)
    assert len(large) == len(small) <= 6, large


def _cli(coordinator, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-m", "hetero.coordinator.cli", *args]
    cmd += ["--coordinator", coordinator.address]
    env = {**os.environ, "COLUMNS": "200"}  # a terminal wide enough for every column
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)


def test_hetero_coord_jobs_shows_owners_the_newest_and_says_what_it_left_out(coordinator) -> None:  # type: ignore[no-untyped-def]
    ids = _flood(coordinator, 120, owner="user:bo")
    some = _cli(coordinator, "jobs", "--limit", "5")
    assert some.returncode == 0, some.stderr
    assert "owner" in some.stdout and "user:bo" in some.stdout
    assert [i for i in ids if i in some.stdout] == ids[:5]
    assert "5 newest of 120 jobs: --limit N or --all for more" in " ".join(some.stdout.split())
    every = _cli(coordinator, "jobs", "--all")
    assert every.returncode == 0, every.stderr
    assert all(i in every.stdout for i in ids) and "for more" not in every.stdout
    bad = _cli(coordinator, "jobs", "--limit", "0")
    assert bad.returncode != 0 and bad.stderr.strip() == "error: --limit must be >= 1, got 0"


def test_a_flood_of_queued_jobs_does_not_hide_a_running_job_from_the_snapshot(coordinator) -> None:  # type: ignore[no-untyped-def]
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(name="n1", address="n1.local", devices=[device]),
        timeout=DEADLINE_S,
    )
    coordinator.clock.now -= 5000.0  # submitted before the flood
    running = coordinator.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=QUEUED)).job
    coordinator.clock.now += 5000.0
    assert running.state == pb.JOB_STATE_PENDING
    _flood(coordinator, messages.WATCH_JOBS + 10)
    snapshot = coordinator.server.snapshot()
    assert running.id in [j.id for j in snapshot.jobs]
    assert snapshot.jobs[-1].id == running.id, "newest first"
