"""``hetero-bench load`` end to end at a CI size, on SQLite and PostgreSQL: a real
coordinator and its worker processes, load generators of real gRPC clients, and the
report's figures (client and server latency, the coordinator's CPU by process, the
database's growth); with ``--queued`` jobs waiting in the coordinator's database and
``--scrapers`` reaching ``/metrics``, the heartbeat latency split by scrape phase. No
timing is asserted: the speed targets are the benchmark's figures."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from hetero.bench.loadconfig import LoadConfig
from hetero.bench.loadreport import render
from hetero.core import defaults
from hetero.core.errors import ConfigError


@pytest.mark.slow
def test_hetero_bench_load_runs_a_small_cluster_without_errors(
    tmp_path: Path, both_stores_url: str
) -> None:
    out = tmp_path / "load"
    on_sqlite = both_stores_url.startswith("sqlite")
    # On SQLite the run makes its own file under --out; on PostgreSQL it gets an empty database.
    db = () if on_sqlite else ("--db", both_stores_url)
    # On SQLite a small job is submitted and the one before cancelled every second
    # (``--churn-s``): launches and stops for the agents' order streams; on PostgreSQL none.
    polls = () if on_sqlite else ("--churn-s", "0")
    # On SQLite the coordinator (and its workers) on the first CPU, the generators on the
    # others, where there are two or more.
    usable = sorted(os.sched_getaffinity(0))
    pinned = on_sqlite and len(usable) >= 2
    pin = ("--coordinator-cpus", str(usable[0])) if pinned else ()
    # On PostgreSQL every rank also calls GetPlan after its job's report (the load this
    # benchmark had first); on SQLite rank 0 alone reports, as the trainer does.
    plans = () if on_sqlite else ("--get-plan-per-rank",)
    # On SQLite the agents heartbeat at the interval the coordinator gives them (as
    # hetero-agent does); on PostgreSQL at one imposed, as this benchmark did first.
    period = () if on_sqlite else ("--heartbeat-s", "1")
    result = _load(out, *("--agents", "50", "--ranks", "16"), *db, *polls, *pin, *plans, *period)
    if pinned:
        assert result["cpus"]["coordinator"] == [usable[0]]
        assert set(result["cpus"]["coordinator_workers"]) <= {usable[0]}
        assert result["cpus"]["generators"] == usable[1:]
        assert f"coordinator on CPUs {usable[0]}, load generators" in render(result)
    else:
        assert result["cpus"]["coordinator"] == result["cpus"]["generators"] == usable
    assert result["errors_total"] == 0, result["error_samples"]
    heartbeat_s = defaults.HEARTBEAT_INTERVAL_S if on_sqlite else 1.0
    assert result["heartbeat_s"] == heartbeat_s
    assert result["methods"]["Heartbeat"]["offered_per_s"] == 50 / heartbeat_s
    coordinators = ", the coordinator's" if on_sqlite else ""
    assert f"heartbeat every {heartbeat_s:g} s{coordinators})" in render(result)
    measured = ["Heartbeat", "ReportIntervalStats"]
    if plans:
        measured.append("GetPlan")
        assert "every rank calls GetPlan after each report" in render(result)
    else:  # not part of the load: neither made nor missing
        assert result["methods"]["GetPlan"]["calls"] == 0
        assert result["methods"]["GetPlan"]["offered_per_s"] == 0
        assert "GetPlan" not in result["not_measured"]
        assert "rank 0 reports, as the trainer does" in render(result)
    for method in measured:
        assert result["methods"][method]["calls"] > 0, method
    pushes = result["methods"]["WatchOrders"]
    if on_sqlite:  # a launch and a stop pushed each second of the window
        assert pushes["calls"] >= 2 and pushes["p99_ms"] > 0, pushes
    else:  # no churn: no orders, nor any offered
        assert pushes["calls"] == 0 and pushes["offered_per_s"] == 0
    assert result["not_measured"] == []
    # The coordinator's own figures of the same calls, from its /metrics histogram read at
    # the window's edges: the calls it finished between the reads, against those the
    # generators started in the window (the calls in flight at either edge differ).
    table = render(result)
    assert "srv p50" in table and "srv p99" in table
    for method in measured:
        m = result["methods"][method]
        assert m["server_errors"] == 0, method
        assert abs(m["server_calls"] - m["calls"]) <= 0.25 * m["calls"] + 5, (method, m)
        assert math.isfinite(m["server_p50_ms"]) and math.isfinite(m["server_p99_ms"]), method
        assert 0 < m["server_p50_ms"] <= m["server_p99_ms"], method
        row = next(line.split() for line in table.splitlines() if line.startswith(method))
        assert row[6:8] == [f"{m['server_p50_ms']:.2f}", f"{m['server_p99_ms']:.2f}"], row
    database = result["database"]
    assert database["store"] == ("sqlite" if on_sqlite else "postgresql")
    rows = database["rows_end"]
    assert rows["nodes"] == 50
    assert rows["interval_stats"] > 0
    assert database["table_bytes"]["interval_stats"] > 0
    # Telemetry is written as buckets close, and all of it at the coordinator's stop.
    url = f"sqlite:///{out / 'state' / 'coordinator.db'}" if on_sqlite else both_stores_url
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            nodes = conn.scalar(text("SELECT count(DISTINCT node_id) FROM telemetry"))
    finally:
        engine.dispose()
    assert nodes == 50
    # The coordinator is one process, /metrics served on its loop.
    by_process = result["coordinator_cpu_cores_by_process"]
    assert set(by_process) == {"coordinator"}, by_process
    assert by_process["coordinator"] > 0, by_process
    assert result["coordinator_cpu_cores"] == pytest.approx(sum(by_process.values()))
    # A database that already holds tables is refused: its figures would not be the run's.
    if not on_sqlite:
        again = subprocess.run(
            [
                *(sys.executable, "-m", "hetero.bench.cli", "load", "--agents", "2"),
                *("--ranks", "0", "--out", str(tmp_path / "again"), *db),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode != 0
        assert "must be an empty database, it has tables" in again.stderr


def _load(out: Path, *args: str) -> dict[str, Any]:
    """``hetero-bench load ARGS --out OUT --json`` at a CI size (2 generator processes, 4 s
    measured after 1 s of warm-up): its JSON, checked against the ``load.json`` it wrote."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "hetero.bench.cli", "load", *args, "--processes", "2"),
            *("--duration", "4", "--warmup", "1", "--out", str(out), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert result == json.loads((out / "load.json").read_text())
    return result


@pytest.mark.slow
def test_queued_jobs_wait_and_scrapers_reach_metrics_during_the_run(tmp_path: Path) -> None:
    out = tmp_path / "load"
    result = _load(
        out,
        *("--agents", "12", "--ranks", "16", "--queued", "30"),
        *("--scrapers", "6", "--scrape-phase-s", "1"),
    )
    assert result["errors_total"] == 0, result["error_samples"]
    assert result["deadline_errors"] == 0
    heartbeat = result["methods"]["Heartbeat"]
    # Every call of the window falls in one phase or the other, and both phases had calls.
    quiet, scraped = heartbeat["without_scrapers"], heartbeat["with_scrapers"]
    assert quiet["calls"] > 0 and scraped["calls"] > 0
    assert quiet["calls"] + scraped["calls"] == heartbeat["calls"]
    assert sum(heartbeat["histogram"]["counts"]) == heartbeat["calls"]
    scrapers = result["scrapers"]
    assert scrapers["scrapes"] > 0 and scrapers["half_open"] > 0
    # The 30 queued jobs are still waiting, each asking for one more than the 48 devices,
    # behind the 2 running jobs; the admission pass gave the head of the queue its reason.
    engine = create_engine(f"sqlite:///{out / 'state' / 'coordinator.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT state, world_size, message FROM jobs WHERE name LIKE 'queued-%'")
            ).all()
    finally:
        engine.dispose()
    assert len(rows) == 30
    assert {(state, world) for state, world, _ in rows} == {("QUEUED", 49)}
    assert any(message.startswith("waiting for 49 CUDA devices") for _, _, message in rows)


def test_load_options_are_checked_at_once() -> None:
    with pytest.raises(ConfigError, match="--queued"):
        LoadConfig(queued=-1)
    with pytest.raises(ConfigError, match="at most 4,096 ranks"):
        LoadConfig(agents=2000, queued=1)
    with pytest.raises(ConfigError, match="2 scrape phases"):
        LoadConfig(scrapers=4, duration_s=15.0, scrape_phase_s=10.0)
    with pytest.raises(ConfigError, match=r"--scrapers-nice must be in \[0, 19\], got 20"):
        LoadConfig(scrapers=4, scrapers_nice=20)
