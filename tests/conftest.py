"""Shared fixtures: run real multi-rank jobs as processes, as torchrun would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from hetero.trainer.launch import launch_local

# Property tests draw the same examples on every run (``make test`` and CI must not fail
# by luck: several check statistical estimators against bounds a rare draw misses);
# HYPOTHESIS_PROFILE=explore draws new ones, to look for failures on purpose. Neither
# times an example: a property holds or not whatever the host's load, and on a 2-core
# box running two test files at once Hypothesis's 200 ms deadline and its "too slow"
# health check failed tests whose properties held.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, print_blob=True, **_UNTIMED)
settings.register_profile("explore", derandomize=False, print_blob=True, **_UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

WORKERS = Path(__file__).parent / "integration" / "workers"


@pytest.fixture(autouse=True)
def _own_default_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every daemon and client a test starts, in-process or as a subprocess, uses a
    default state directory of that test's own, never the machine's (as root,
    /var/lib/hetero) nor another test's: a token a coordinator generated there would
    be found by later clients and change what they are told."""
    state = tmp_path_factory.mktemp("default-state")
    monkeypatch.setenv("HETERO_STATE_DIR", str(state))
    return state


def _run_workers(log_dir: Path, script: str, nproc: int, *args: str, timeout_s: float) -> None:
    cmd = [sys.executable, str(WORKERS / script), *args]
    code = launch_local(cmd, nproc, log_dir=log_dir, timeout_s=timeout_s)
    assert code == 0, f"{script} on {nproc} ranks exited with {code}"


@pytest.fixture
def run_ranks(tmp_path: Path):
    """``run_ranks(script, nproc, *args)`` runs ``tests/integration/workers/<script>`` on
    ``nproc`` Gloo ranks and asserts they all exit 0."""

    def run(script: str, nproc: int, *args: str, timeout_s: float = 240) -> None:
        _run_workers(tmp_path / "logs", script, nproc, *args, timeout_s=timeout_s)

    return run


def _ranks_in_turn(
    state_dir: Path, nproc: int, jobs: Sequence[Sequence[str]], *, timeout_s: float = 600
) -> None:
    argv = [str(state_dir)]
    for job in jobs:
        argv += ["--", *job]
    _run_workers(state_dir / "logs", "in_turn.py", nproc, *argv, timeout_s=timeout_s)


@pytest.fixture(scope="session")  # a function of its arguments alone
def ranks_in_turn():
    """``ranks_in_turn(state_dir, nproc, jobs)`` runs each job of ``jobs`` (``[script,
    *args]`` of ``tests/integration/workers``) one after another in the same ``nproc``
    Gloo rank processes (``workers/in_turn.py``), and asserts they all exit 0. For a
    module's fixture: jobs of several tests on one launch, whose ranks import torch once."""
    return _ranks_in_turn


def _hetero_train(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "hetero.trainer.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


@pytest.fixture(scope="session")  # a function of its arguments alone
def hetero_train():
    """``hetero_train(*args)`` runs the ``hetero-train`` CLI as a user would and returns
    the finished process (stdout, stderr, returncode)."""
    return _hetero_train
