"""``hetero-coord serve`` in a process of its own, for tests that need the real daemon
(its /metrics process, its signals, its log): started with its output in a file,
waited on until a log line appears; its child processes waited for and killed if a
test leaves them."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

#: Seconds a loaded 2-core runner may take to start the daemon and print a line.
START_S = 60.0


def serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``hetero-coord serve --listen 127.0.0.1:0 --state-dir tmp_path/state ARGS``; its
    output goes to ``tmp_path/coordinator.log``, returned with the process."""
    log = tmp_path / "coordinator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "hetero.coordinator.cli", "serve"),
                *("--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")),
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def wait_for_line(
    proc: subprocess.Popen[bytes], log: Path, pattern: str, timeout_s: float = START_S
) -> re.Match[str]:
    """The first match of ``pattern`` in the log, once it is there; fails with the log if
    the daemon exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while (found := re.search(pattern, log.read_text())) is None:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return found


def still_running(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after up to ``timeout_s``. An exited process
    whose parent died is reaped by init, when init gets to it: until then it is a
    zombie, which has exited all the same (``psutil.wait_procs`` would wait for it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def kill_left(proc: subprocess.Popen[bytes], children: list[psutil.Process]) -> None:
    """A test's last word: the coordinator and those of its ``children`` still running
    killed, whatever the test's assertions said."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for child in children:
        try:
            if child.is_running():
                child.kill()
        except psutil.NoSuchProcess:
            pass
