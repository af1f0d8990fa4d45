"""``hetero-bench load``: a scale test of the control plane against one real coordinator.

Starts ``hetero-coord serve`` as a subprocess on a fresh SQLite file, then
``--processes`` load-generator processes (``hetero.bench.loadgen``) that play
``--agents`` node agents (register, then heartbeat with telemetry every
``--heartbeat-s`` and poll for orders when the reply says some are pending) and ``--ranks`` training ranks in jobs of
``--world-size`` (each interval rank 0 reports every rank's statistics, then
every rank asks for the plan). After ``--warmup-s`` it measures for
``--duration-s``: achieved vs offered calls per second, p50/p99/max latency per
method, errors, the coordinator's CPU (psutil, in cores), the load
generators' CPU, and the database's growth, extrapolated per hour, with the
steady states that retention bounds telemetry and interval statistics to.

The load generators share the machine with the coordinator; their CPU is
reported beside the coordinator's so the reader can tell who used the cores.
Benchmarks are not tests: this prints figures and exits 0 when the run
completed, whatever the figures are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetero.core.errors import ConfigError, HeteroError

if TYPE_CHECKING:
    import psutil

# grpc, psutil and the coordinator (sqlalchemy) are imported when a run starts:
# registering the subcommand must not need them (a GPU box runs ``hetero-bench run``
# with torch alone).

#: Seconds the coordinator may take to answer its first call.
START_TIMEOUT_S = 30.0
#: Seconds per simulated agent the generators may take to register them all (plus a floor).
REGISTER_S_PER_AGENT = 0.05
#: The latency target of the issue, in seconds (p99 of Heartbeat and GetPlan).
TARGET_P99_S = 0.050

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


class LoadError(HeteroError):
    """The load run could not be set up or did not complete."""

    exit_code = 1


#: When simulated agents poll for orders (``LoadConfig.poll``).
POLL_MODES = ("asked", "always", "never")


@dataclass(frozen=True)
class LoadConfig:
    agents: int = 1000
    ranks: int = 256
    world_size: int = 8
    processes: int = 4
    duration_s: float = 120.0
    warmup_s: float = 10.0
    heartbeat_s: float = 1.0
    interval_s: float = 1.0
    devices_per_agent: int = 4
    #: ``asked``: poll after a heartbeat whose reply says orders are pending (the
    #: agent); ``always``: after every heartbeat (agents before that flag); ``never``.
    poll: str = "asked"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.agents < 1 or self.processes < 1 or self.world_size < 1:
            raise ConfigError("--agents, --processes and --world-size must be >= 1")
        if self.ranks < 0 or self.ranks % self.world_size:
            raise ConfigError(f"--ranks ({self.ranks}) must be a multiple of --world-size")
        if self.ranks > self.agents * self.devices_per_agent:
            raise ConfigError(f"--ranks ({self.ranks}) exceeds the agents' devices")
        if min(self.duration_s, self.heartbeat_s, self.interval_s) <= 0 or self.warmup_s < 0:
            raise ConfigError("durations and periods must be > 0 (--warmup-s >= 0)")
        if not 1 <= self.devices_per_agent <= 64:
            raise ConfigError("--devices-per-agent must be in [1, 64]")
        if self.poll not in POLL_MODES:
            raise ConfigError(f"--poll must be one of {', '.join(POLL_MODES)}, got {self.poll!r}")

    @property
    def jobs(self) -> int:
        return self.ranks // self.world_size


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "load",
        help="scale test: many simulated agents and ranks against one real coordinator",
        description="Start hetero-coord on a fresh SQLite file and drive it with simulated "
        "agents (heartbeats with telemetry, polls) and ranks (interval reports, GetPlan) from "
        "several processes; report achieved rates, latency percentiles, errors, CPU and "
        "database growth.",
    )
    d = LoadConfig()
    p.add_argument("--agents", type=int, default=d.agents, help=f"default {d.agents}")
    p.add_argument("--ranks", type=int, default=d.ranks, help=f"default {d.ranks}")
    p.add_argument("--world-size", type=int, default=d.world_size, help="ranks per job")
    p.add_argument("--processes", type=int, default=d.processes, help="load-generator processes")
    p.add_argument("--duration", type=float, default=d.duration_s, dest="duration_s", metavar="S")
    p.add_argument("--warmup", type=float, default=d.warmup_s, dest="warmup_s", metavar="S")
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s, metavar="S")
    p.add_argument("--interval-s", type=float, default=d.interval_s, metavar="S")
    p.add_argument("--devices-per-agent", type=int, default=d.devices_per_agent)
    p.add_argument(
        "--poll",
        choices=POLL_MODES,
        default=d.poll,
        help="when agents call PollAssignments: 'asked' (default, as hetero-agent does: after "
        "a heartbeat whose reply says orders are pending), 'always' (after every heartbeat, as "
        "agents did before that flag) or 'never'",
    )
    p.add_argument("--out", type=Path, help="run directory (default: a new temporary one)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=load_command)


def load_command(args: argparse.Namespace) -> int:
    config = LoadConfig(
        agents=args.agents,
        ranks=args.ranks,
        world_size=args.world_size,
        processes=args.processes,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        heartbeat_s=args.heartbeat_s,
        interval_s=args.interval_s,
        devices_per_agent=args.devices_per_agent,
        poll=args.poll,
    )
    out = args.out or Path(tempfile.mkdtemp(prefix="hetero-load-"))
    results = run_load(config, out)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(render(results))
    return 0


# ---- the run ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_coordinator(out: Path) -> tuple[subprocess.Popen[bytes], str]:
    import grpc

    address = f"127.0.0.1:{_free_port()}"
    log = (out / "coordinator.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "hetero.coordinator.cli", "serve"),
            *("--listen", address, "--state-dir", str(out / "state")),
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
            poll=config.poll,
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

    from hetero.transport import remote_error
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
            # As the agents would: the ranks start, so polls stop carrying launch orders.
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


@dataclass(frozen=True)
class Sample:
    """What the run looked like at one instant: process CPU seconds and database size."""

    time_s: float
    coordinator_cpu_s: float
    generators_cpu_s: float
    db_bytes: int
    rows: dict[str, int]


def _cpu_s(proc: psutil.Process) -> float:
    import psutil

    try:
        t = proc.cpu_times()
    except psutil.Error:
        return math.nan
    return float(t.user + t.system + t.children_user + t.children_system)


def _db_files(state: Path) -> list[Path]:
    return [state / f"coordinator.db{suffix}" for suffix in ("", "-wal", "-shm")]


def _rows(db: Path) -> dict[str, int]:
    """Row counts per table, read through a separate read-only connection (WAL: no blocking)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: int(con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables}
    finally:
        con.close()


def _sample(coord: psutil.Process, gens: list[psutil.Process], state: Path) -> Sample:
    size = sum(p.stat().st_size for p in _db_files(state) if p.exists())
    return Sample(
        time_s=time.perf_counter(),
        coordinator_cpu_s=_cpu_s(coord),
        generators_cpu_s=sum(_cpu_s(g) for g in gens),
        db_bytes=size,
        rows=_rows(state / "coordinator.db"),
    )


def _table_bytes(db: Path) -> dict[str, int]:
    """Bytes per table including its indexes (SQLite's dbstat), {} if not compiled in."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat d "
            "LEFT JOIN sqlite_master m ON m.name = d.name GROUP BY 1"
        ).fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        con.close()
    return {str(name): int(size) for name, size in rows}


def run_load(config: LoadConfig, out: Path) -> dict[str, Any]:
    """Run the whole scale test in ``out``; return the results (also written to load.json)."""
    import psutil

    out.mkdir(parents=True, exist_ok=True)
    coord, address = _start_coordinator(out)
    gens: list[subprocess.Popen[bytes]] = []
    try:
        gens = _spawn_workers(config, address, out)
        t_register = time.perf_counter()
        _wait_ready(gens, out, config.agents)
        register_s = time.perf_counter() - t_register
        jobs = _submit_jobs(address, config)
        start = time.time() + config.warmup_s
        end = start + config.duration_s
        go = {"jobs": jobs, "world_size": config.world_size, "start_unix_s": start}
        go["end_unix_s"] = end
        (out / "go.json.tmp").write_text(json.dumps(go))
        (out / "go.json.tmp").rename(out / "go.json")
        cproc = psutil.Process(coord.pid)
        gprocs = [psutil.Process(g.pid) for g in gens]
        time.sleep(max(0.0, start - time.time()))
        first = _sample(cproc, gprocs, out / "state")
        cpu_series = []
        cproc.cpu_percent()
        while time.time() < end:
            time.sleep(min(1.0, max(0.0, end - time.time())))
            cpu_series.append(cproc.cpu_percent() / 100.0)
        last = _sample(cproc, gprocs, out / "state")
        for w, g in enumerate(gens):
            try:
                g.wait(timeout=30.0 + 2 * config.duration_s)
            except subprocess.TimeoutExpired:
                raise LoadError(f"load generator {w} did not finish") from None
            if g.returncode != 0:
                raise LoadError(f"load generator {w} exited with {g.returncode}; see {out}/gen{w}")
    finally:
        for g in gens:
            if g.poll() is None:
                g.kill()
                g.wait()
        coord.send_signal(signal.SIGTERM)
        try:
            coord.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            coord.kill()
            coord.wait()
    results = summarize(config, out, first, last, cpu_series, register_s)
    (out / "load.json").write_text(json.dumps(results, indent=2))
    return results


# ---- the figures -------------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def summarize(
    config: LoadConfig,
    out: Path,
    first: Sample,
    last: Sample,
    cpu_series: list[float],
    register_s: float,
) -> dict[str, Any]:
    from hetero.coordinator.retention import IntervalRetention
    from hetero.coordinator.store import TelemetryPolicy

    latencies: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    late: dict[str, int] = {}
    samples: list[str] = []
    for folder in sorted(out.glob("gen*")):
        r = json.loads((folder / "result.json").read_text())
        for method, values in r["latencies_s"].items():
            latencies.setdefault(method, []).extend(values)
        for key, n in r["errors"].items():
            errors[key] = errors.get(key, 0) + n
        for key, n in r["late"].items():
            late[key] = late.get(key, 0) + n
        samples += r["error_samples"]
    offered = {
        "Heartbeat": config.agents / config.heartbeat_s,
        # Polls on demand have no schedule: the table shows what was asked for.
        "PollAssignments": config.agents / config.heartbeat_s
        if config.poll == "always"
        else math.nan
        if config.poll == "asked"
        else 0.0,
        "ReportIntervalStats": config.jobs / config.interval_s,
        "GetPlan": config.ranks / config.interval_s,
    }
    methods = {}
    for method, rate in offered.items():
        values = sorted(latencies.get(method, []))
        failed = sum(n for k, n in errors.items() if k.startswith(f"{method}:"))
        methods[method] = {
            "offered_per_s": rate,
            "achieved_per_s": len(values) / config.duration_s,
            "calls": len(values),
            "errors": failed,
            "late_starts": late.get(method, 0),
            "p50_ms": _percentile(values, 0.50) * 1e3,
            "p99_ms": _percentile(values, 0.99) * 1e3,
            "max_ms": (values[-1] if values else math.nan) * 1e3,
        }
    elapsed_s = last.time_s - first.time_s
    policy = TelemetryPolicy()
    per_hour = 3600.0 / elapsed_s
    db_growth = (last.db_bytes - first.db_bytes) * per_hour
    row_growth = {t: (last.rows.get(t, 0) - n) * per_hour for t, n in first.rows.items()}
    table_bytes = _table_bytes(out / "state" / "coordinator.db")
    rows_now = last.rows
    bytes_per_row = {
        t: table_bytes[t] / rows_now[t] for t in table_bytes if rows_now.get(t) and t in rows_now
    }
    # File size moves in steps (pages, the WAL); rows times each table's bytes per row
    # (dbstat, indexes included) is the steadier rate.
    growth_by_table = {
        t: row_growth[t] * bytes_per_row[t] for t in row_growth if t in bytes_per_row
    }
    telemetry_rows_bound = (
        config.agents * (config.devices_per_agent + 1) * policy.retention_s / policy.period_s
    )
    telemetry_bound = telemetry_rows_bound * bytes_per_row.get("telemetry", math.nan)
    # Rank 0 reports a row per rank at every boundary (end steps step by the spec's
    # rebalance_interval), so thinning keeps exactly 1 interval in thin_every.
    kept = IntervalRetention()
    intervals_rows_bound = kept.bound_rows(config.ranks / config.interval_s)
    intervals_bound = intervals_rows_bound * bytes_per_row.get("interval_stats", math.nan)
    cores = os.cpu_count() or 1
    return {
        "config": asdict(config),
        "machine": {"cpu_cores": cores, "python": sys.version.split()[0]},
        "note": "load generators and coordinator share this machine's cores",
        "register_s": register_s,
        "methods": methods,
        "errors_total": sum(errors.values()),
        "errors": errors,
        "error_samples": samples[:20],
        "coordinator_cpu_cores": (last.coordinator_cpu_s - first.coordinator_cpu_s) / elapsed_s,
        "coordinator_cpu_cores_max_1s": max(cpu_series, default=math.nan),
        "generators_cpu_cores": (last.generators_cpu_s - first.generators_cpu_s) / elapsed_s,
        "database": {
            "bytes_start": first.db_bytes,
            "bytes_end": last.db_bytes,
            "growth_bytes_per_h": db_growth,
            "growth_by_table_bytes_per_h": growth_by_table,
            "growth_rows_model_bytes_per_h": sum(growth_by_table.values()),
            "rows_end": rows_now,
            "row_growth_per_h": row_growth,
            "table_bytes": table_bytes,
            "telemetry_period_s": policy.period_s,
            "telemetry_retention_s": policy.retention_s,
            "telemetry_rows_bound": telemetry_rows_bound,
            "telemetry_bytes_bound": telemetry_bound,
            "interval_stats_raw_s": kept.raw_s,
            "interval_stats_thin_every": kept.thin_every,
            "interval_stats_keep_s": kept.keep_s,
            "interval_stats_rows_bound": intervals_rows_bound,
            "interval_stats_bytes_bound": intervals_bound,
        },
        "target_p99_ms": TARGET_P99_S * 1e3,
        "target_met": all(
            methods[m]["p99_ms"] < TARGET_P99_S * 1e3 for m in ("Heartbeat", "GetPlan")
        ),
        "out": str(out),
    }


def render(r: dict[str, Any]) -> str:
    c = r["config"]
    lines = [
        f"hetero-bench load: {c['agents']} agents ({c['devices_per_agent']} devices each, "
        f"heartbeat every {c['heartbeat_s']:g} s), {c['ranks']} ranks in "
        f"{c['ranks'] // c['world_size']} jobs (interval {c['interval_s']:g} s), "
        f"{c['processes']} generator processes, {c['duration_s']:g} s measured",
        f"{'method':<20} {'offered/s':>10} {'achieved/s':>11} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'errors':>7} {'late':>6}",
    ]
    for name, m in r["methods"].items():
        if not m["offered_per_s"] and not m["calls"]:
            continue
        offered = "asked" if math.isnan(m["offered_per_s"]) else f"{m['offered_per_s']:.1f}"
        lines.append(
            f"{name:<20} {offered:>10} {m['achieved_per_s']:>11.1f} "
            f"{m['p50_ms']:>8.2f} {m['p99_ms']:>8.2f} {m['max_ms']:>8.1f} {m['errors']:>7d} "
            f"{m['late_starts']:>6d}"
        )
    db = r["database"]
    lines += [
        f"coordinator CPU {r['coordinator_cpu_cores']:.2f} cores (max 1 s: "
        f"{r['coordinator_cpu_cores_max_1s']:.2f}); load generators "
        f"{r['generators_cpu_cores']:.2f} cores; machine has {r['machine']['cpu_cores']} "
        "(shared)",
        f"database {db['bytes_end'] / 1e6:.1f} MB (with WAL), file growing "
        f"{db['growth_bytes_per_h'] / 1e6:.0f} MB/h; by rows: "
        + ", ".join(
            f"{t} {v / 1e6:.0f} MB/h"
            for t, v in sorted(db["growth_by_table_bytes_per_h"].items())
            if v > 0
        ),
        f"telemetry is bounded by its retention ({db['telemetry_retention_s'] / 3600:g} h at "
        f"{db['telemetry_period_s']:g} s): {db['telemetry_rows_bound']:.3g} rows, "
        f"~{db['telemetry_bytes_bound'] / 1e9:.2f} GB",
        f"interval stats are bounded by their retention (whole for "
        f"{db['interval_stats_raw_s'] / 3600:g} h, then 1 interval in "
        f"{db['interval_stats_thin_every']}, deleted after {db['interval_stats_keep_s'] / 86400:g} "
        f"d): {db['interval_stats_rows_bound']:.3g} rows, "
        f"~{db['interval_stats_bytes_bound'] / 1e9:.2f} GB",
        f"errors: {r['errors_total']}; p99 target {r['target_p99_ms']:g} ms for Heartbeat and "
        f"GetPlan: {'met' if r['target_met'] else 'MISSED'}",
        f"run directory: {r['out']}",
    ]
    return "\n".join(lines)
