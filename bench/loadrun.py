"""The run of ``hetero-bench load``: a real ``hetero-coord serve`` on a fresh SQLite file,
``LoadConfig.processes`` load-generator processes (``hetero.bench.loadgen``) that
register the simulated agents, the jobs submitted and their ranks reported running,
then the measured window, sampled at its start and end (``loadreport``), the
coordinator's own latency histogram among the samples (``loadserver``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hetero.bench.loadconfig import LoadConfig, LoadError, available_cpus
from hetero.bench.loaddb import LoadDatabase
from hetero.bench.loadreport import sample, summarize

# grpc, psutil and the coordinator (sqlalchemy) are imported when a run starts:
# registering the subcommand must not need them (a GPU box runs ``hetero-bench run``
# with torch alone).

#: Seconds the coordinator may take to answer its first call.
START_TIMEOUT_S = 30.0
#: Seconds per simulated agent the generators may take to register them all (plus a floor).
REGISTER_S_PER_AGENT = 0.05

#: The job the churn submits (``LoadConfig.churn_s``): one rank, ahead of any queue.
CHURN_SPEC = """\
name: churn-{index}
model: debug
global_batch: 8
steps: 1000
priority: 10
resources:
  ranks: 1
  device: cuda
"""

JOB_SPEC = """\
name: load-{index}
model: debug
global_batch: {global_batch}
steps: 100000000
policy: dynamic
rebalance_interval: 10
resources:
  ranks: {world_size}
  device: cuda
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _on_cpus(cpus: set[int]) -> Iterator[None]:
    """Processes started inside run on ``cpus`` (empty: unchanged): the calling thread's
    CPU mask, which a child inherits, is set for the while."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _start_coordinator(
    out: Path, db_url: str | None, metrics_port: int, cpus: set[int]
) -> tuple[subprocess.Popen[bytes], str]:
    import grpc

    address = f"127.0.0.1:{_free_port()}"
    db = ("--db", db_url) if db_url else ()
    # /metrics on loopback, which needs no token: the run reads the coordinator's own
    # latency there (``loadserver``), and ``--scrapers`` scrape it.
    metrics = ("--metrics-listen", f"127.0.0.1:{metrics_port}")
    log = (out / "coordinator.log").open("wb")
    with _on_cpus(cpus):  # its worker processes inherit the mask
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "hetero.coordinator.cli", "serve"),
                *("--listen", address, "--state-dir", str(out / "state"), *db, *metrics),
                # The simulated agents present no token: the figures are the server's own
                # paths, comparable with those measured before the default token.
                "--insecure",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    log.close()
    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            proc.kill()
            raise LoadError(f"coordinator did not answer; see {out / 'coordinator.log'}") from None
    return proc, address


def _spawn_workers(config: LoadConfig, address: str, out: Path) -> list[subprocess.Popen[bytes]]:
    from hetero.bench.loadgen import WorkerConfig

    procs = []
    run_id = f"{os.getpid():x}{int(time.time()) % 100000:x}"
    for w in range(config.processes):
        first = config.agents * w // config.processes
        last = config.agents * (w + 1) // config.processes
        folder = out / f"gen{w}"
        folder.mkdir(parents=True, exist_ok=True)
        worker = WorkerConfig(
            coordinator=address,
            run_id=run_id,
            first_agent=first,
            agents=last - first,
            devices_per_agent=config.devices_per_agent,
            heartbeat_s=config.heartbeat_s,
            interval_s=config.interval_s,
            get_plan_per_rank=config.get_plan_per_rank,
            job_indexes=tuple(range(w, config.jobs, config.processes)),
            seed=config.seed * 1000 + w,
        )
        (folder / "config.json").write_text(json.dumps(asdict(worker)))
        log = (folder / "loadgen.log").open("wb")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "hetero.bench.loadgen", str(folder / "config.json")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
    return procs


def _spawn_scrapers(config: LoadConfig, port: int, out: Path) -> subprocess.Popen[bytes]:
    from hetero.bench.loadscrape import ScrapeConfig

    folder = out / "scrape"
    folder.mkdir(parents=True, exist_ok=True)
    scrape = ScrapeConfig(
        "127.0.0.1", port, config.scrapers, config.scrape_phase_s, config.scrapers_nice
    )
    (folder / "config.json").write_text(json.dumps(asdict(scrape)))
    log = (folder / "scrape.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetero.bench.loadscrape", str(folder / "config.json")],
        stdout=log,
        stderr=subprocess.STDOUT,
        # A session of its own: where the kernel groups sessions for CPU time
        # (autogroup), its niceness is its own group's (``loadscrape``).
        start_new_session=True,
    )
    log.close()
    return proc


def _wait_ready(procs: list[subprocess.Popen[bytes]], out: Path, agents: int) -> None:
    deadline = time.monotonic() + 30.0 + REGISTER_S_PER_AGENT * agents
    while time.monotonic() < deadline:
        for w, p in enumerate(procs):
            if p.poll() is not None:
                raise LoadError(f"load generator {w} exited with {p.returncode}; see {out}/gen{w}")
        if all((out / f"gen{w}" / "ready").exists() for w in range(len(procs))):
            return
        time.sleep(0.1)
    raise LoadError("simulated agents did not all register in time")


def _submit_jobs(address: str, config: LoadConfig) -> list[str]:
    import grpc

    from hetero.security.transport import remote_error
    from hetero.v1 import coordinator_pb2 as pb
    from hetero.v1 import coordinator_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
        ids = []
        for i in range(config.jobs):
            spec = JOB_SPEC.format(
                index=i, global_batch=32 * config.world_size, world_size=config.world_size
            )
            try:
                resp = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=30.0)
            except grpc.RpcError as exc:
                raise LoadError(
                    f"submitting load job {i}: {remote_error(exc, f'the coordinator at {address}')}"
                ) from None
            ids.append(resp.job_id)
            # As the agents would: the ranks start (before the window).
            for r in resp.job.ranks:
                stub.ReportRankStatus(
                    pb.ReportRankStatusRequest(
                        node_id=r.node_id,
                        job_id=resp.job_id,
                        rank=r.rank,
                        state=pb.RANK_STATE_RUNNING,
                    ),
                    timeout=30.0,
                )
        return ids


def _churn(address: str, config: LoadConfig, start: float, end: float) -> int:
    """Every ``churn_s`` of the window submit a small job and cancel the one before: a
    launch and a stop for the agents' order streams to carry. How many it submitted."""
    import grpc

    from hetero.v1 import coordinator_pb2 as pb
    from hetero.v1 import coordinator_pb2_grpc as pb_grpc

    made = 0
    last = ""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
        time.sleep(max(0.0, start - time.time()))
        while time.time() < end - config.churn_s:
            try:
                spec = CHURN_SPEC.format(index=made)
                job = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=10.0).job_id
                made += 1
                if last:
                    stub.CancelJob(pb.CancelJobRequest(job_id=last), timeout=10.0)
                last = job
            except grpc.RpcError:
                pass  # counted by the generators' figures, not here
            time.sleep(config.churn_s)
        if last:
            with contextlib.suppress(grpc.RpcError):
                stub.CancelJob(pb.CancelJobRequest(job_id=last), timeout=10.0)
    return made


def run_load(config: LoadConfig, out: Path) -> dict[str, Any]:
    """Run the whole scale test in ``out``; return the results (also written to load.json)."""
    out.mkdir(parents=True, exist_ok=True)
    db = LoadDatabase(out / "state", config.db)
    try:
        db.check_empty()
        return _run(config, out, db)
    finally:
        db.close()


def _run(config: LoadConfig, out: Path, db: LoadDatabase) -> dict[str, Any]:
    import psutil

    from hetero.bench import loadserver
    from hetero.bench.loadqueue import write_queued
    from hetero.coordinator.database import sqlite_url

    metrics_port = _free_port()
    if config.queued:
        (out / "state").mkdir(parents=True, exist_ok=True)
        write_queued(config.db or sqlite_url(out / "state"), config)
    ours = set(config.coordinator_cpus)
    theirs = available_cpus() - ours if ours else set()
    coord, address = _start_coordinator(out, config.db, metrics_port, ours)
    gens: list[subprocess.Popen[bytes]] = []
    scrapers: list[subprocess.Popen[bytes]] = []
    try:
        with _on_cpus(theirs):
            gens = _spawn_workers(config, address, out)
        t_register = time.perf_counter()
        _wait_ready(gens, out, config.agents)
        register_s = time.perf_counter() - t_register
        jobs = _submit_jobs(address, config)
        if config.scrapers:
            # Not sampled with the generators: their CPU is the simulated agents'.
            with _on_cpus(theirs):
                scrapers.append(_spawn_scrapers(config, metrics_port, out))
        start = time.time() + config.warmup_s
        end = start + config.duration_s
        go = {"jobs": jobs, "world_size": config.world_size, "start_unix_s": start}
        go["end_unix_s"] = end
        (out / "go.json.tmp").write_text(json.dumps(go))
        (out / "go.json.tmp").rename(out / "go.json")
        cproc = psutil.Process(coord.pid)
        gprocs = [psutil.Process(g.pid) for g in gens]
        # The CPUs each side ran on, as the kernel has them (``--coordinator-cpus``).
        cpus = {
            "coordinator": sorted(cproc.cpu_affinity()),
            "coordinator_workers": sorted({c for p in cproc.children() for c in p.cpu_affinity()}),
            "generators": sorted({c for p in gprocs for c in p.cpu_affinity()}),
        }
        if config.churn_s:
            threading.Thread(
                target=_churn, args=(address, config, start, end), name="churn", daemon=True
            ).start()
        time.sleep(max(0.0, start - time.time()))
        # The coordinator's histogram first: its edges are the nearest to the window's.
        server_first = loadserver.read(metrics_port)
        first = sample(cproc, gprocs, db)
        cpu_series = []
        cproc.cpu_percent()
        while time.time() < end:
            time.sleep(min(1.0, max(0.0, end - time.time())))
            cpu_series.append(cproc.cpu_percent() / 100.0)
        server_last = loadserver.read(metrics_port)
        last = sample(cproc, gprocs, db)
        for w, g in enumerate([*gens, *scrapers]):
            what = f"load generator {w}" if w < len(gens) else "the /metrics scrapers"
            try:
                g.wait(timeout=30.0 + 2 * config.duration_s)
            except subprocess.TimeoutExpired:
                raise LoadError(f"{what} did not finish") from None
            if g.returncode != 0:
                raise LoadError(f"{what} exited with {g.returncode}; see {out}")
    finally:
        for g in [*gens, *scrapers]:
            if g.poll() is None:
                g.kill()
                g.wait()
        coord.send_signal(signal.SIGTERM)
        try:
            coord.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            coord.kill()
            coord.wait()
    server = loadserver.between(server_first, server_last)
    results = summarize(config, out, first, last, cpu_series, register_s, db, server)
    results["cpus"] = cpus
    (out / "load.json").write_text(json.dumps(results, indent=2))
    return results
