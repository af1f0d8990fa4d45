"""``hetero-bench load``: a scale test of the control plane against one real coordinator.

Starts ``hetero-coord serve`` as a subprocess on a fresh SQLite file (or, with
``--db``, an empty PostgreSQL database), then
``--processes`` load-generator processes (``hetero.bench.loadgen``) that play
``--agents`` node agents (register, then heartbeat with telemetry every
``--heartbeat-s``, and hold one order stream each) and ``--ranks`` training ranks in jobs of
``--world-size`` (each interval rank 0 reports every rank's statistics, their
times varying by up to 3% as a real interval's do, as the trainer's rank 0 does;
``--get-plan-per-rank``: every rank then asks for the plan). After ``--warmup-s`` it measures for
``--duration-s``: achieved vs offered calls per second, p50/p99/max latency per
method as the generators saw it (and a histogram of each in ``load.json``), the
coordinator's own p50/p99 of the same methods beside them (its ``/metrics`` histogram
read at the window's edges, ``loadserver``), errors (those past their deadline
apart), the coordinator's CPU (psutil, in cores), the load
generators' CPU, and the database's growth, extrapolated per hour, with the
steady states that retention bounds telemetry and interval statistics to.
``--queued`` keeps a queue of jobs waiting behind the running ones (``loadqueue``);
``--scrapers`` scrapes ``/metrics`` in every other phase (``loadscrape``) and
reports the heartbeat latency with and without the scrapers.

The load generators share the machine with the coordinator; their CPU is
reported beside the coordinator's so the reader can tell who used the cores.
Benchmarks are not tests: this prints figures and exits 0 when the run
completed, whatever the figures are.

This module is the command; ``loadconfig`` holds what a run is asked to do,
``loadrun`` the run and ``loadreport`` its figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from hetero.bench.loadconfig import LoadConfig, parse_cpus
from hetero.bench.loadreport import render
from hetero.bench.loadrun import run_load


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "load",
        help="scale test: many simulated agents and ranks against one real coordinator",
        description="Start hetero-coord on a fresh SQLite file and drive it with simulated "
        "agents (heartbeats with telemetry, order streams) and ranks (interval reports, GetPlan) from "
        "several processes; report achieved rates, latency percentiles as the clients saw "
        "them (p50/p99/max ms) and as the coordinator's /metrics histogram saw its own "
        "handling (srv p50/p99, interpolated in its buckets), errors, CPU and database growth.",
    )
    d = LoadConfig()
    p.add_argument("--agents", type=int, default=d.agents, help=f"default {d.agents}")
    p.add_argument("--ranks", type=int, default=d.ranks, help=f"default {d.ranks}")
    p.add_argument("--world-size", type=int, default=d.world_size, help="ranks per job")
    p.add_argument("--processes", type=int, default=d.processes, help="load-generator processes")
    p.add_argument("--duration", type=float, default=d.duration_s, dest="duration_s", metavar="S")
    p.add_argument("--warmup", type=float, default=d.warmup_s, dest="warmup_s", metavar="S")
    p.add_argument(
        "--heartbeat-s",
        type=float,
        default=d.heartbeat_s,
        metavar="S",
        help="seconds between one agent's heartbeats (default: the interval the coordinator "
        "gives at registration, as hetero-agent uses: 2 s unless configured; this "
        "benchmark's figures before 2026-11-28 used 1)",
    )
    p.add_argument("--interval-s", type=float, default=d.interval_s, metavar="S")
    p.add_argument("--devices-per-agent", type=int, default=d.devices_per_agent)
    p.add_argument(
        "--churn-s",
        type=float,
        default=d.churn_s,
        metavar="S",
        help="every S seconds of the window submit a small job and cancel the one before, "
        "so the agents' order streams carry launches and stops whose pushes are timed "
        "(WatchOrders); 0: none (default %(default)s)",
    )
    p.add_argument(
        "--get-plan-per-rank",
        action="store_true",
        default=d.get_plan_per_rank,
        help="every rank also calls GetPlan after its job's report (the load of this "
        "benchmark before 2026-11-28, 8 more calls a report); the trainer does not: rank 0 "
        "reports and broadcasts the plan to the other ranks itself",
    )
    p.add_argument(
        "--queued",
        type=int,
        default=d.queued,
        metavar="N",
        help="N more jobs that wait QUEUED for the whole run (each asks for every device), "
        "written to the database as SubmitJob stores a waiting job (default 0)",
    )
    p.add_argument(
        "--scrapers",
        type=int,
        default=d.scrapers,
        metavar="N",
        help="N concurrent /metrics clients, half scraping, half holding half-open "
        "connections, in every other phase of --scrape-phase-s; the report gives the "
        "heartbeat latency with and without them (default 0: none)",
    )
    p.add_argument(
        "--scrapers-nice",
        type=int,
        default=d.scrapers_nice,
        metavar="N",
        help="CPU niceness of the scrapers' process, 0 to 19: they stand in for Prometheus "
        "and attackers on other hosts, so by default they take only the CPU the coordinator "
        f"and the generators leave (default {d.scrapers_nice}; 0: an equal share)",
    )
    p.add_argument(
        "--coordinator-cpus",
        metavar="LIST",
        help="run the coordinator and its worker processes on these CPUs only (e.g. 0-1) "
        "and the load generators and scrapers on the others: on a host with cores to "
        "spare, a coordinator of that many cores with its clients off its cores "
        "(default: no pinning, all share every CPU)",
    )
    p.add_argument(
        "--scrape-phase-s",
        type=float,
        default=d.scrape_phase_s,
        metavar="S",
        help="default %(default)s",
    )
    p.add_argument(
        "--db",
        metavar="URL",
        help="run the coordinator on this empty PostgreSQL database, e.g. "
        "postgresql+psycopg://hetero@localhost/load (default: a new SQLite file in --out)",
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
        churn_s=args.churn_s,
        get_plan_per_rank=args.get_plan_per_rank,
        db=args.db,
        queued=args.queued,
        scrapers=args.scrapers,
        scrape_phase_s=args.scrape_phase_s,
        scrapers_nice=args.scrapers_nice,
        coordinator_cpus=parse_cpus(args.coordinator_cpus) if args.coordinator_cpus else (),
    )
    out = args.out or Path(tempfile.mkdtemp(prefix="hetero-load-"))
    results = run_load(config, out)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(render(results))
    return 0
