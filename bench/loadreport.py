"""The figures of ``hetero-bench load``: what is sampled while it runs (process CPU, the
database's size and rows) and what is computed from the generators' results and
printed afterwards (achieved vs offered rates, latency percentiles, the coordinator's
own beside them (``loadserver``), errors, CPU in cores, the database's growth per hour
beside the bounds its retention sets).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetero.bench.loadconfig import LoadConfig, available_cpus, format_cpus
from hetero.bench.loaddb import LoadDatabase
from hetero.bench.loadlatency import by_scrape_phase, histogram, percentile
from hetero.bench.loadserver import Buckets, figures

if TYPE_CHECKING:
    import psutil

# psutil and the coordinator (sqlalchemy) are imported when a run starts: registering
# the subcommand must not need them (a GPU box runs ``hetero-bench run`` with torch alone).

#: The p99 latency targets (ms), per method (``WatchOrders``: a push's, send to arrival).
#: A method with no calls in the window is not slow, and is reported as not measured.
TARGETS_P99_MS = {
    "Heartbeat": 50.0,
    "GetPlan": 50.0,
    "ReportIntervalStats": 100.0,
    "WatchOrders": 100.0,
}
#: Heartbeat p99 with ``/metrics`` scrapers over the one without, at most.
TARGET_SCRAPE_RATIO = 1.2
#: What the ``server_*`` figures of each method are.
SERVER_NOTE = (
    "server_*: the coordinator's own handling (hetero_rpc_duration_seconds of its /metrics, "
    "read at the window's start and end), calls answered OK, p50/p99 interpolated in the "
    "histogram's buckets; server_errors: calls answered otherwise"
)


@dataclass(frozen=True)
class Sample:
    """What the run looked like at one instant: process CPU seconds and database size."""

    time_s: float
    #: CPU seconds of the coordinator's processes, summed by name: ``coordinator`` (its
    #: main process) and any child's (a process pool's, where one runs).
    coordinator_cpu_s: dict[str, float]
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


def _tree_cpu_s(coord: psutil.Process) -> dict[str, float]:
    """The coordinator's CPU seconds and its worker processes', by process name. A worker
    is a live child (its CPU is not in the coordinator's until it has exited): one that
    ended between two samples loses what it used since the first."""
    import psutil

    by_name = {"coordinator": _cpu_s(coord)}
    try:
        children = coord.children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            name = child.name()
        except psutil.Error:
            continue
        by_name[name] = by_name.get(name, 0.0) + _cpu_s(child)
    return by_name


def sample(coord: psutil.Process, gens: list[psutil.Process], db: LoadDatabase) -> Sample:
    return Sample(
        time_s=time.perf_counter(),
        coordinator_cpu_s=_tree_cpu_s(coord),
        generators_cpu_s=sum(_cpu_s(g) for g in gens),
        db_bytes=db.size_bytes(),
        rows=db.rows(),
    )


def _cores_by_process(first: Sample, last: Sample) -> dict[str, float]:
    """Cores each of the coordinator's processes used between the two samples (a worker
    started between them: all it used)."""
    elapsed_s = last.time_s - first.time_s
    return {
        name: (cpu_s - first.coordinator_cpu_s.get(name, 0.0)) / elapsed_s
        for name, cpu_s in sorted(last.coordinator_cpu_s.items())
    }


def summarize(
    config: LoadConfig,
    out: Path,
    first: Sample,
    last: Sample,
    cpu_series: list[float],
    register_s: float,
    db: LoadDatabase,
    server: Buckets,
) -> dict[str, Any]:
    """``server``: the coordinator's latency histogram over the window (``loadserver``)."""
    from hetero.coordinator.retention import IntervalRetention
    from hetero.coordinator.store import TelemetryPolicy

    latencies: dict[str, list[float]] = {}
    starts: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    late: dict[str, int] = {}
    samples: list[str] = []
    periods: set[float] = set()
    for folder in sorted(out.glob("gen*")):
        r = json.loads((folder / "result.json").read_text())
        periods.add(r["heartbeat_s"])
        for method, values in r["latencies_s"].items():
            latencies.setdefault(method, []).extend(values)
            starts.setdefault(method, []).extend(r["starts_s"][method])
        for key, n in r["errors"].items():
            errors[key] = errors.get(key, 0) + n
        for key, n in r["late"].items():
            late[key] = late.get(key, 0) + n
        samples += r["error_samples"]
    # Every agent heartbeats at one period: the one imposed, else the coordinator's (NaN
    # from a generator none of whose agents registered).
    heartbeat_s = max((p for p in periods if not math.isnan(p)), default=math.nan)
    offered = {
        "Heartbeat": config.agents / heartbeat_s,
        "WatchOrders": 2 / config.churn_s if config.churn_s else 0.0,  # a launch, a stop
        "ReportIntervalStats": config.jobs / config.interval_s,
        "GetPlan": config.ranks / config.interval_s if config.get_plan_per_rank else 0.0,
    }
    methods = {}
    for method, rate in offered.items():
        raw = latencies.get(method, [])
        values = sorted(raw)
        failed = sum(n for k, n in errors.items() if k.startswith(f"{method}:"))
        methods[method] = {
            "offered_per_s": rate,
            "achieved_per_s": len(values) / config.duration_s,
            "calls": len(values),
            "errors": failed,
            "late_starts": late.get(method, 0),
            "p50_ms": percentile(values, 0.50) * 1e3,
            "p99_ms": percentile(values, 0.99) * 1e3,
            "max_ms": (values[-1] if values else math.nan) * 1e3,
            "histogram": histogram(values),
            **figures(server, method),
        }
        if config.scrapers:
            methods[method] |= by_scrape_phase(raw, starts.get(method, []), config.scrape_phase_s)
    scrape = _scrape_summary(out, config)
    by_process = _cores_by_process(first, last)
    elapsed_s = last.time_s - first.time_s
    policy = TelemetryPolicy()
    per_hour = 3600.0 / elapsed_s
    db_growth = (last.db_bytes - first.db_bytes) * per_hour
    row_growth = {t: (last.rows.get(t, 0) - n) * per_hour for t, n in first.rows.items()}
    table_bytes = db.table_bytes()
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
        "config": {**asdict(config), "db": db.shown_url()},
        "machine": {"cpu_cores": cores, "python": sys.version.split()[0]},
        "note": (
            f"coordinator on CPUs {format_cpus(config.coordinator_cpus)}, load generators "
            f"and scrapers on CPUs {format_cpus(available_cpus() - set(config.coordinator_cpus))}"
            if config.coordinator_cpus
            else "load generators and coordinator share this machine's cores"
        ),
        # Seconds between one agent's heartbeats as they ran (``config.heartbeat_s``: None
        # = the coordinator's interval, given at registration).
        "heartbeat_s": heartbeat_s,
        "register_s": register_s,
        "methods": methods,
        "errors_total": sum(errors.values()),
        "deadline_errors": sum(n for k, n in errors.items() if k.endswith(":DEADLINE_EXCEEDED")),
        "errors": errors,
        "error_samples": samples[:20],
        # The coordinator's processes together, then each (``coordinator``: its main one).
        "coordinator_cpu_cores": sum(by_process.values()),
        "coordinator_cpu_cores_by_process": by_process,
        # Its main process's busiest second.
        "coordinator_cpu_cores_max_1s": max(cpu_series, default=math.nan),
        "generators_cpu_cores": (last.generators_cpu_s - first.generators_cpu_s) / elapsed_s,
        "database": {
            "store": db.kind,
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
        "server_latency": SERVER_NOTE,
        "targets_p99_ms": TARGETS_P99_MS,
        "target_met": _targets_met(methods, errors),
        # A method with no call in the window has no p99: it is not slow, nor measured.
        # GetPlan is offered only with ``--get-plan-per-rank``, pushes with ``--churn-s``.
        "not_measured": [
            m for m in TARGETS_P99_MS if not methods[m]["calls"] and methods[m]["offered_per_s"]
        ],
        "scrapers": scrape,
        "out": str(out),
    }


def _ms(value: float | None) -> str:
    """A server-side figure for the table: "-" where it has none (no call, or a
    load.json written before the coordinator had a histogram)."""
    return f"{'-':>8}" if value is None or math.isnan(value) else f"{value:>8.2f}"


def _targets_met(methods: dict[str, Any], errors: dict[str, int]) -> bool:
    """Every method's p99 under its target and no call past its deadline."""
    fast = all(
        not methods[m]["calls"] or methods[m]["p99_ms"] < limit
        for m, limit in TARGETS_P99_MS.items()
    )
    return fast and not any(k.endswith(":DEADLINE_EXCEEDED") for k in errors)


def _scrape_summary(out: Path, config: LoadConfig) -> dict[str, Any] | None:
    """What the ``/metrics`` scrapers did (``loadscrape``), None without them; the
    heartbeat p99 with them over the one without (the target: at most 1.2)."""
    path = out / "scrape" / "result.json"
    if not config.scrapers or not path.exists():
        return None
    r = json.loads(path.read_text())
    scrapes = sorted(r.pop("scrape_latencies_s"))
    return {
        **r,
        "scrape_p50_ms": percentile(scrapes, 0.50) * 1e3,
        "scrape_p99_ms": percentile(scrapes, 0.99) * 1e3,
    }


def render(r: dict[str, Any]) -> str:
    c = r["config"]
    lines = [
        f"hetero-bench load: {c['agents']} agents ({c['devices_per_agent']} devices each, "
        f"heartbeat every {r.get('heartbeat_s', c['heartbeat_s']):g} s"
        + (", the coordinator's" if c["heartbeat_s"] is None else "")
        + f"), {c['ranks']} ranks in "
        f"{c['ranks'] // c['world_size']} jobs (interval {c['interval_s']:g} s; "
        + (
            "every rank calls GetPlan after each report"
            if c.get("get_plan_per_rank", True)
            else "rank 0 reports, as the trainer does, times varying up to 3%"
        )
        + "), "
        f"{c['processes']} generator processes, {c['duration_s']:g} s measured",
        f"{'method':<20} {'offered/s':>10} {'achieved/s':>11} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'srv p50':>8} {'srv p99':>8} {'errors':>7} {'late':>6}",
    ]
    for name, m in r["methods"].items():
        if not m["offered_per_s"] and not m["calls"]:
            continue
        offered = "asked" if math.isnan(m["offered_per_s"]) else f"{m['offered_per_s']:.1f}"
        lines.append(
            f"{name:<20} {offered:>10} {m['achieved_per_s']:>11.1f} "
            f"{m['p50_ms']:>8.2f} {m['p99_ms']:>8.2f} {m['max_ms']:>8.1f} "
            f"{_ms(m.get('server_p50_ms'))} {_ms(m.get('server_p99_ms'))} {m['errors']:>7d} "
            f"{m['late_starts']:>6d}"
        )
    lines.append(
        "p50/p99/max: as the load generators saw the calls (the coordinator, the network and "
        "the shared cores' queue); srv p50/p99: the coordinator's own handling, from its "
        "/metrics histogram, interpolated in its buckets"
    )
    if r.get("scrapers"):
        sc, hb = r["scrapers"], r["methods"]["Heartbeat"]
        quiet, busy = hb["without_scrapers"]["p99_ms"], hb["with_scrapers"]["p99_ms"]
        lines.append(
            f"/metrics: {c['scrapers']} clients (half scraping, half half-open; nice "
            f"{c.get('scrapers_nice', 0)}) in every other "
            f"{c['scrape_phase_s']:g} s: {sc['scrapes']} scrapes (p99 {sc['scrape_p99_ms']:.1f} "
            f"ms), {sc['half_open']} half-open connections, {sc.get('cut', 0)} cut at their "
            f"phase's end; Heartbeat p99 {quiet:.2f} ms "
            f"without, {busy:.2f} ms with ({busy / quiet:.2f}x, target <= "
            f"{TARGET_SCRAPE_RATIO:g}x)"
        )
    db = r["database"]
    lines += [
        f"coordinator CPU {r['coordinator_cpu_cores']:.2f} cores ("
        + ", ".join(
            f"{name} {cores:.2f}"
            for name, cores in r.get("coordinator_cpu_cores_by_process", {}).items()
        )
        + f"; main process's busiest second {r['coordinator_cpu_cores_max_1s']:.2f}); load generators "
        f"{r['generators_cpu_cores']:.2f} cores; machine has {r['machine']['cpu_cores']} "
        + (f"({r['note']})" if r["config"].get("coordinator_cpus") else "(shared)"),
        f"database ({db.get('store', 'sqlite')}) {db['bytes_end'] / 1e6:.1f} MB"
        f"{' (with WAL)' if db.get('store', 'sqlite') == 'sqlite' else ''}, growing "
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
        f"errors: {r['errors_total']} ({r['deadline_errors']} past their deadline); p99 targets "
        + ", ".join(f"{m} {v:g} ms" for m, v in r["targets_p99_ms"].items())
        + f", no deadline errors: {'met' if r['target_met'] else 'MISSED'}"
        + (
            f" (no calls, not measured: {', '.join(r['not_measured'])})"
            if r.get("not_measured")
            else ""
        ),
        f"run directory: {r['out']}",
    ]
    return "\n".join(lines)
