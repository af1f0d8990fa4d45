"""``hetero-bench load --queued N --scrapers M`` end to end at a CI size: the queued jobs
wait in the real coordinator's database with the admission pass's reason, the
scrapers reach ``/metrics`` (full scrapes and half-open connections), and the
report splits the heartbeat latency by scrape phase and keeps a histogram per
method. No timing is asserted: the speed targets are the benchmark's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from hetero.bench.loadconfig import LoadConfig
from hetero.core.errors import ConfigError


@pytest.mark.slow
def test_queued_jobs_wait_and_scrapers_reach_metrics_during_the_run(tmp_path: Path) -> None:
    out = tmp_path / "load"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "hetero.bench.cli", "load", "--agents", "12", "--ranks", "16"),
            *("--processes", "2", "--queued", "30", "--scrapers", "6", "--scrape-phase-s", "1"),
            *("--duration", "4", "--warmup", "1", "--out", str(out), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
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
    # The 30 queued jobs are still waiting, each asking for all 48 devices, behind the 2
    # running jobs; the admission pass gave the head of the queue its reason.
    engine = create_engine(f"sqlite:///{out / 'state' / 'coordinator.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT state, world_size, message FROM jobs WHERE name LIKE 'queued-%'")
            ).all()
    finally:
        engine.dispose()
    assert len(rows) == 30
    assert {(state, world) for state, world, _ in rows} == {("QUEUED", 48)}
    assert any(message.startswith("waiting for 48 CUDA devices") for _, _, message in rows)


def test_load_options_are_checked_at_once() -> None:
    with pytest.raises(ConfigError, match="--queued"):
        LoadConfig(queued=-1)
    with pytest.raises(ConfigError, match="at most 4,096 ranks"):
        LoadConfig(agents=2000, queued=1)
    with pytest.raises(ConfigError, match="2 scrape phases"):
        LoadConfig(scrapers=4, duration_s=15.0, scrape_phase_s=10.0)
    with pytest.raises(ConfigError, match=r"--scrapers-nice must be in \[0, 19\], got 20"):
        LoadConfig(scrapers=4, scrapers_nice=20)
