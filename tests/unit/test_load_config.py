"""``hetero-bench load``'s flags are checked before anything starts: one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetero.bench.loadconfig import LoadConfig
from hetero.core.errors import ConfigError


def test_a_negative_poll_period_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--poll-every must be >= 0 seconds, got -1"):
        LoadConfig(poll_every_s=-1)
    done = subprocess.run(
        [sys.executable, "-m", "hetero.bench.cli", "load", "--poll-every", "-1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --poll-every must be >= 0 seconds, got -1"
    assert not any(tmp_path.iterdir())  # nothing started, nothing written
