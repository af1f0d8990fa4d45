"""``hetero-bench load``'s flags are checked before anything starts: one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.bench.loadconfig import LoadConfig, format_cpus, parse_cpus
from hetero.core.errors import ConfigError


def test_a_negative_churn_period_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--churn-s must be >= 0 seconds, got -1"):
        LoadConfig(churn_s=-1)
    done = subprocess.run(
        [sys.executable, "-m", "hetero.bench.cli", "load", "--churn-s", "-1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --churn-s must be >= 0 seconds, got -1"
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_coordinator_cpus_are_read_as_lists_and_ranges_and_checked() -> None:
    assert parse_cpus("0-1") == (0, 1) and parse_cpus("3, 0-1,8") == (0, 1, 3, 8)
    assert format_cpus((0, 1, 3, 8, 9, 10)) == "0-1,3,8-10"
    with pytest.raises(ConfigError, match=r"--coordinator-cpus: 'a' is not a CPU number"):
        parse_cpus("0,a")
    with pytest.raises(ConfigError, match=r"--coordinator-cpus: bad range '3-1'"):
        parse_cpus("3-1")
    usable = sorted(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match=r"leaves no CPU for the load generators"):
        LoadConfig(coordinator_cpus=tuple(usable))
    beyond = max(usable) + 1
    with pytest.raises(ConfigError, match=rf"CPU {beyond} is not one this process may use"):
        LoadConfig(coordinator_cpus=(beyond,))


def test_a_bad_cpu_list_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hetero.bench.cli", "load", "--coordinator-cpus", "0-x"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --coordinator-cpus: '0-x' is not a CPU number or range like 0-1"
    )


def test_the_scrapers_lower_their_session_group_where_the_kernel_has_one(tmp_path: Path) -> None:
    """``loadscrape.lower_priority`` in a process leading a session of its own (as
    ``loadrun`` starts the scrapers): its niceness, and its autogroup's where the kernel
    groups sessions (else a niceness within a group the coordinator's outweighs)."""
    code = (
        "import os\n"
        "from pathlib import Path\n"
        "from hetero.bench.loadscrape import lower_priority\n"
        "lower_priority(7)\n"
        "group = Path('/proc/self/autogroup')\n"
        "print(os.nice(0), group.read_text().split()[-1] if group.exists() else 'none')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=True,
    )
    nice, group = done.stdout.split()
    assert int(nice) == min(19, os.nice(0) + 7)
    assert group in ("7", "none")


def test_agents_heartbeat_at_the_coordinators_interval_unless_one_is_given() -> None:
    assert LoadConfig().heartbeat_s is None
    assert LoadConfig(heartbeat_s=1.0).heartbeat_s == 1.0
    with pytest.raises(ConfigError, match="durations and periods must be > 0"):
        LoadConfig(heartbeat_s=0.0)
