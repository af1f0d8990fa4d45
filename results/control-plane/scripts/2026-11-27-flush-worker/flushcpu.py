"""Coordinator-side CPU of one heartbeat flush: 1,000 registered nodes with 4 devices
each on a SQLite file, beats at 1 Hz per node offered as the Heartbeat handler does,
a flush every 0.25 s of the beats' clock (about 250 nodes' liveness plus the closed
buckets whose turn has come) and also a flush of all 1,000 nodes at once.

Usage, from the repository root: .venv/bin/python flushcpu.py [worker] (worker:
through heartbeatworker.HeartbeatWorker, every flush whatever its size; without:
on the calling thread). NODES=N changes the number of nodes. CPU is
time.thread_time() of the flushing thread and time.process_time() of the
whole process (concurrent.futures' manager and feeder threads included), around
HeartbeatIngest.flush; the first 30 s of the beats' clock are not counted.
Written to compare main's ingest (its offer takes a callable) with the branch's
(it takes the request)."""

from __future__ import annotations

import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hetero.bench.loadgen import device_profiles, heartbeat_request
from hetero.coordinator import store, wire
from hetero.coordinator.database import open_database, read_session_factory, session_factory
from hetero.coordinator.ingest import HeartbeatIngest

NODES, DEVICES = int(os.environ.get("NODES", "1000")), 4
NEW = "request" in inspect.signature(HeartbeatIngest.offer).parameters


def main() -> None:
    worker = len(sys.argv) > 1 and sys.argv[1] == "worker"
    tmp = Path(tempfile.mkdtemp())
    url = f"sqlite:///{tmp / 'coordinator.db'}"
    engine = open_database(url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    t0 = 1_700_000_000.0
    with sessions.begin() as s:
        ids = [
            store.register_node(
                s,
                name=f"n{i:04d}",
                address=f"10.0.{i // 256}.{i % 256}",
                agent_endpoint="",
                agent_version="t",
                devices=[wire.device_row(d) for d in device_profiles(DEVICES)],
                now=t0,
            ).id
            for i in range(NODES)
        ]
    kwargs = {}
    hb = None
    if worker:
        from hetero.coordinator.heartbeatworker import HeartbeatWorker

        hb = HeartbeatWorker(url, min_beats=1)  # every flush, whatever its size
        kwargs["worker"] = hb
    ingest = HeartbeatIngest(sessions, readers, store.TelemetryPolicy(), **kwargs)
    for n in ids:
        ingest.known(n)
    reqs = {n: heartbeat_request(n, DEVICES, 1) for n in ids}

    def offer(nodes: list[str], now: float) -> None:
        for n in nodes:
            req = reqs[n]
            if NEW:  # the request itself, as the Heartbeat handler passes it now
                ingest.offer(store.Beat(n, now, ()), req)
            else:
                ingest.offer(store.Beat(n, now, ()), lambda req=req: wire.telemetry_values(req))

    # Warm-up (the worker, if any, starts at the first flush): 30 s of beats' clock.
    now = t0
    quarter = NODES // 4
    rows: list[tuple[float, float, float, int]] = []
    for step in range(4 * 60):
        now += 0.25
        offer(ids[(step % 4) * quarter : (step % 4 + 1) * quarter], now)
        w0, p0, c0 = time.perf_counter(), time.process_time(), time.thread_time()
        n = ingest.flush()
        c1, p1, w1 = time.thread_time(), time.process_time(), time.perf_counter()
        if step >= 4 * 30:
            rows.append((c1 - c0, p1 - p0, w1 - w0, n))
        if step == 0 and hb is not None:
            assert hb.wait_ready(60), "no worker"
    whole = []
    for _ in range(10):
        now += 1.0
        offer(ids, now)
        c0, p0 = time.thread_time(), time.process_time()
        ingest.flush()
        whole.append((time.thread_time() - c0, time.process_time() - p0))

    def ms(xs: list[float]) -> str:
        xs = sorted(xs)
        return (
            f"median {1e3 * statistics.median(xs):.2f} mean {1e3 * statistics.fmean(xs):.2f} "
            f"p90 {1e3 * xs[int(0.9 * len(xs))]:.2f} max {1e3 * xs[-1]:.2f} ms"
        )

    print(
        f"mode: {'worker' if worker else 'in the coordinator'}; {len(rows)} flushes of "
        f"{statistics.fmean(r[3] for r in rows):.0f} beats on average"
    )
    print("  flushing thread CPU :", ms([r[0] for r in rows]))
    print("  whole process CPU   :", ms([r[1] for r in rows]))
    print("  wall                :", ms([r[2] for r in rows]))
    print("flush of all 1,000 nodes' liveness (10 flushes):")
    print("  flushing thread CPU :", ms([w[0] for w in whole]))
    print("  whole process CPU   :", ms([w[1] for w in whole]))
    if hb is not None:
        print(f"  worker answered {hb.answered}, fallbacks {hb.fallbacks}")
        hb.close()
    engine.dispose()
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
