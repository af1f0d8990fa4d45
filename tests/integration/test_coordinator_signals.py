"""``hetero-coord serve`` stops on SIGTERM whichever of its threads the kernel hands it to.

A process-directed signal may be delivered to any thread that does not block it; the
Python handler runs only on the main thread, once that thread returns to Python. A
coordinator whose main thread slept in one unbounded wait kept serving when the signal
landed on one of its gRPC or event-loop threads. The test sends SIGTERM to one such
thread directly (``tgkill``), the case a loaded host produced by chance.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="tgkill is Linux's")


#: tgkill's system call number on the architectures CI and users run.
_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def _tgkill(pid: int, tid: int, sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_TGKILL[os.uname().machine], pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def _other_thread(pid: int) -> int:
    """A thread of ``pid`` other than its main one (the coordinator runs several)."""
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert tids, "the coordinator runs no thread but its main one"
    return tids[-1]


def test_sigterm_delivered_to_another_thread_stops_the_coordinator(tmp_path: Path) -> None:
    log = tmp_path / "coordinator.log"
    code = "import sys; from hetero import entry; sys.exit(entry.coord())"
    argv = [sys.executable, "-c", code, "serve", "--listen", "127.0.0.1:0"]
    argv += ["--state-dir", str(tmp_path / "state"), "--db", f"sqlite:///{tmp_path / 'c.db'}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while re.search(r"coordinator listening on", log.read_text()) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        _tgkill(proc.pid, _other_thread(proc.pid), signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert "received SIGTERM, stopping" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
