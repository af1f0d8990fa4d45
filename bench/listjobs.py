"""What listing jobs costs with thousands in the store: ``ListJobs`` over real gRPC
(port 0, a SQLite file), and ``hetero-coord jobs`` as a user runs it.

    python -m hetero.bench.listjobs --queued 10000 --finished 1000

The store gets ``--queued`` queued jobs (no ranks, no plan: what a flood leaves)
and ``--finished`` succeeded ones of 2 ranks each with a plan (what a day of work
leaves), then the script times, each ``--repeat`` times (the median is printed):
the first page (the server's default size), a page of 1,000, every page in turn,
and the CLI (a process of its own: interpreter start-up included).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from hetero.bench import seed
from hetero.coordinator import lifecycle, persist
from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.server import Settings, create_server
from hetero.coordinator.state import Plan, Rank
from hetero.core.jobspec import parse_jobspec
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1.coordinator_pb2_grpc import CoordinatorStub

SPEC = "name: flood\nglobal_batch: 32\nsteps: 10\nresources: {ranks: 2, device: cpu}\n"


def fill(url: str, queued: int, finished: int) -> None:
    """``queued`` QUEUED jobs and ``finished`` SUCCEEDED ones (2 ranks, one plan)."""
    spec = parse_jobspec(SPEC, source="listjobs")
    engine = open_database(url)
    sessions = session_factory(engine)
    with sessions.begin() as s:
        node = seed.cpu_node("n1", 1, now=0.0)
        seed.save(s, persist.save_node(node, devices=True))
        for i in range(finished):
            job = seed.queued_job(spec, SPEC, now=float(i), priority=0, owner="bench")
            job.state, job.finished_at_unix_s = lifecycle.SUCCEEDED, i + 1.0
            job.ranks = [
                Rank(
                    rank=r,
                    node_id=node.id,
                    device_index=0,
                    device_kind="cpu",
                    device_name="cpu0",
                    local_rank=r,
                    state=lifecycle.EXITED,
                    exit_code=0,
                )
                for r in range(2)
            ]
            plan = Plan(1, 0, (16, 16), "dynamic", "initial", created_at_unix_s=float(i))
            seed.save(s, persist.save_job(job), persist.add_plan(job.id, plan))
        for i in range(queued):
            job = seed.queued_job(spec, SPEC, now=float(finished + i), priority=0, owner="bench")
            seed.save(s, persist.save_job(job))
    engine.dispose()


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def every_page(stub: CoordinatorStub) -> int:
    """Jobs read following ``next_page_token`` to the end."""
    seen, token = 0, ""
    while True:
        resp = stub.ListJobs(pb.ListJobsRequest(limit=1000, page_token=token), timeout=120)
        seen += len(resp.jobs)
        token = resp.next_page_token
        if not token:
            return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--finished", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'coordinator.db'}"
        fill(url, args.queued, args.finished)
        server, port = create_server("127.0.0.1:0", Settings(db_url=url, heartbeat_timeout_s=10.0))
        server.start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = CoordinatorStub(channel)
                total = args.queued + args.finished
                print(f"{total:,} jobs ({args.queued:,} queued, {args.finished:,} finished)")
                first = median_s(lambda: stub.ListJobs(pb.ListJobsRequest(), timeout=120), 5)
                print(f"ListJobs, default page:    {first * 1000:8.1f} ms")
                big = median_s(
                    lambda: stub.ListJobs(pb.ListJobsRequest(limit=1000), timeout=120),
                    args.repeat,
                )
                print(f"ListJobs, limit 1000:      {big * 1000:8.1f} ms")
                seen = every_page(stub)
                pages = median_s(lambda: every_page(stub), args.repeat)
                print(f"ListJobs, all {seen:,} jobs: {pages * 1000:8.1f} ms")
                cli = [sys.executable, "-m", "hetero.coordinator.cli", "jobs"]
                cli += ["--coordinator", f"127.0.0.1:{port}"]
                run = lambda: subprocess.run(cli, check=True, capture_output=True)  # noqa: E731
                print(f"hetero-coord jobs:         {median_s(run, args.repeat) * 1000:8.1f} ms")
        finally:
            server.stop(0).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
