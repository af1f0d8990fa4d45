"""The noisy neighbour: back-to-back bf16 matmuls on one GPU, switched by a control file.

Run as ``python -m hetero.bench.harness.neighbour --device cuda:1 --control F``.
It allocates two ``size``² matrices, multiplies once, writes the ``--ready``
file, then loops: while the control file says ``on`` it keeps about one burst
of matmuls queued behind the one running (the GPU never idles between bursts,
and switching off takes effect within one burst, a few ms); while ``off`` it
sleeps. With ``--duty D`` below 1 (a light neighbour) it instead waits for
each burst to finish and idles ``burst time × (1/D − 1)`` before the next. It re-reads the control file every ``poll_s`` and exits on SIGTERM or
SIGINT, or when its parent process is gone, so a killed harness leaves no
orphan burning a GPU. After each switch it reads it writes the state beside the
control file (``.seen``), and the harness's switch waits for it. ``--log`` gets JSON lines: ready, every switch, and
once a second the matmul rate (TFLOP/s) it achieved.

Why a control file: the harness decides *when* (it watches the training's
metrics for the arrival and departure steps) and this process only has to
read one small file, so a switch costs no CUDA start-up at the moment it
matters; the file also survives either side being slow to look.

:class:`NeighbourProcess` (harness side) starts it in its own session, waits
for ready, switches it and always stops it (context manager).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO


def write_control(path: Path, on: bool) -> None:
    """Atomically write ``on``/``off`` to the control file."""
    tmp = path.with_name(path.name + ".tmp")  # the control's and the .seen file's apart
    tmp.write_text("on\n" if on else "off\n")
    os.replace(tmp, path)


def seen_path(control: Path) -> Path:
    """Where the neighbour writes the state it last read from ``control``."""
    return control.with_suffix(".seen")


def read_control(path: Path | None) -> bool:
    """``True`` unless the control file exists and says ``off`` (no file: always on)."""
    if path is None:
        return True
    try:
        return path.read_text().strip() != "off"
    except FileNotFoundError:
        return True


#: Seconds :meth:`NeighbourProcess.switch` waits for the neighbour to see a switch.
SWITCH_TIMEOUT_S = 10.0


class NeighbourProcess:
    """Harness side: start, switch and always stop one neighbour process."""

    def __init__(
        self,
        argv: Sequence[str],
        control: Path,
        ready: Path,
        *,
        env: Mapping[str, str] | None = None,
        start_on: bool = True,
        ready_timeout_s: float = 120.0,
        stderr_path: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.control = control
        self.ready = ready
        self.env = dict(os.environ) | dict(env or {})
        self.start_on = start_on
        self.ready_timeout_s = ready_timeout_s
        self.stderr_path = stderr_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.on = start_on
        self._err: Any = None

    def start(self) -> None:
        """Start and wait until it has run its first matmul; raise ``RuntimeError`` if it dies."""
        self.ready.unlink(missing_ok=True)
        write_control(self.control, self.start_on)
        self._err = self.stderr_path.open("wb") if self.stderr_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            start_new_session=True,  # a Ctrl-C aimed at the harness reaches it only through stop()
        )
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.ready.exists():
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"the neighbour process exited with status {code} before ready")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the neighbour was not ready after {self.ready_timeout_s:.0f} s"
                )
            time.sleep(0.05)

    def switch(self, on: bool, timeout_s: float = SWITCH_TIMEOUT_S) -> None:
        """Switch it and wait until it has seen the switch (``seen_path``), at most
        ``timeout_s``: a harness that read two switches' steps in one look (it was slow
        to look) would otherwise write on and off before the neighbour read either."""
        write_control(self.control, on)
        self.on = on
        seen, deadline = seen_path(self.control), time.monotonic() + timeout_s
        while not (seen.exists() and read_control(seen) == on):
            if not self.alive() or time.monotonic() > deadline:
                return  # its log and the run's record say what it ran
            time.sleep(0.005)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM its process group, SIGKILL after ``grace_s``; idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self._err not in (None, subprocess.DEVNULL):
            self._err.close()
        self._err = None

    def __enter__(self) -> NeighbourProcess:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# -- the neighbour process itself --------------------------------------------------------


def _log(fh: TextIO | None, **record: Any) -> None:
    if fh is not None:
        fh.write(json.dumps({"time_s": time.time(), **record}) + "\n")
        fh.flush()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hetero-bench-neighbour", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda:0", help="torch device, e.g. cuda:1 (cpu for tests)")
    p.add_argument("--size", type=int, default=8192, help="matrix side (elements)")
    p.add_argument("--burst", type=int, default=4, help="matmuls queued per burst")
    p.add_argument(
        "--duty",
        type=float,
        default=1.0,
        help="fraction of time busy: below 1 it waits for each burst and then idles "
        "burst time x (1/duty - 1) (a light neighbour); 1 = back to back (heavy)",
    )
    p.add_argument("--control", type=Path, help="file holding on/off (absent: always on)")
    p.add_argument("--poll-s", type=float, default=0.02, help="seconds between control reads")
    p.add_argument("--log", type=Path)
    p.add_argument("--ready", type=Path, help="created once the first matmul has finished")
    args = p.parse_args(argv)
    if not 0.0 < args.duty <= 1.0:
        p.error(f"--duty must be in (0, 1], got {args.duty}")

    import torch

    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    parent = os.getppid()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    a = torch.randn(args.size, args.size, device=device, dtype=dtype)
    b = torch.randn(args.size, args.size, device=device, dtype=dtype)
    c = torch.empty_like(a)
    torch.matmul(a, b, out=c)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    log = args.log.open("a") if args.log else None
    _log(log, event="ready", device=str(device), size=args.size)
    if args.ready:
        args.ready.write_text("ready\n")
    flop = 2.0 * args.size**3
    on = read_control(args.control)
    _log(log, event="on" if on else "off")
    if args.control is not None:
        write_control(seen_path(args.control), on)
    last_poll = last_report = time.perf_counter()
    done = 0
    previous: Any = None
    while not stop:
        now = time.perf_counter()
        if now - last_poll >= args.poll_s:
            last_poll = now
            if os.getppid() != parent:
                _log(log, event="parent gone")
                break
            want = read_control(args.control)
            if want != on:
                on = want
                _log(log, event="on" if on else "off")
                if args.control is not None:
                    write_control(seen_path(args.control), on)
        if now - last_report >= 1.0:
            _log(log, event="rate", on=on, tflop_per_s=done * flop / (now - last_report) / 1e12)
            done, last_report = 0, now
        if not on:
            time.sleep(args.poll_s / 2)
            continue
        burst_start = time.perf_counter()
        for _ in range(args.burst):
            torch.matmul(a, b, out=c)
        done += args.burst
        if args.duty < 1.0:
            if cuda:
                torch.cuda.synchronize(device)
            busy = time.perf_counter() - burst_start
            # At least 1 ms: GPU bursts take tens of ms, toy sizes in tests would spin.
            time.sleep(max(busy * (1.0 / args.duty - 1.0), 1e-3))
            continue
        if cuda:
            event = torch.cuda.Event()
            event.record()
            if previous is not None:
                previous.synchronize()  # keep one burst queued, never an unbounded backlog
            previous = event
    if cuda:
        torch.cuda.synchronize(device)
    _log(log, event="exit")
    if log is not None:
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
