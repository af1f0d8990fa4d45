"""Start N local ranks as processes, the way torchrun or an agent would.

Each child gets its ``hetero.core.rankenv.RankEnv`` (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, the backend) and a fair share
of the CPU threads. If one rank fails the others are stopped (a dead peer would leave
them blocked in a collective) and its exit status is returned. Only rank 0's
standard output is shown; every rank's standard error is.

Each rank runs in a process group of its own, and SIGTERM to the launcher reaches
every rank once, forwarded: a scheduler that signals the launcher alone (a
container's first process) and one that signals its whole group both ask each rank
once to stop, which then checkpoints and exits with 143 (``trainer.drain``; a second
SIGTERM, forwarded too, kills). A rank that exits 143 is not a failure: its peers stop
at the same step, and the launcher returns 143 once they have. Ctrl-C reaches the
launcher alone and stops the ranks the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from hetero.core import cpus
from hetero.core.rankenv import RankEnv
from hetero.trainer import safefile

#: A rank that stopped on SIGTERM with its state checkpointed (``trainer.drain``).
STOPPED = 128 + signal.SIGTERM
#: Seconds the peers of a rank that stopped get to stop too before they are stopped.
STOP_GRACE_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the rendezvous binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rank_env(
    rank: int,
    world_size: int,
    port: int,
    *,
    threads: int,
    backend: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` (this process's environment) plus local rank ``rank``'s variables."""
    env = dict(os.environ if base is None else base)
    local = RankEnv(
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        master_addr="127.0.0.1",
        master_port=port,
        backend=backend,
        threads=threads,
        launched=True,
    )
    env.update(local.to_env())
    return env


def launch_local(
    argv: Sequence[str],
    nproc: int,
    *,
    backend: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    timeout_s: float | None = None,
) -> int:
    """Run ``argv`` as ``nproc`` ranks; return 0 if all succeed, else the first failure's code.

    ``backend`` is the job's (``HETERO_BACKEND``); ``extra_env`` is set last. A
    failure is reported on standard error as one line naming the rank.
    """
    port = free_port()
    threads = max(1, cpus.usable() // nproc)
    procs: list[subprocess.Popen[bytes]] = []
    logs = []

    def forward(signum: int, frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, forward) if main else None
    try:
        for rank in range(nproc):
            env = rank_env(rank, nproc, port, threads=threads, backend=backend)
            env.update(extra_env or {})
            stdout = None
            if rank > 0:
                if log_dir is not None:
                    fh = safefile.open_file(log_dir / f"rank{rank}.out", append=False)
                    logs.append(fh)
                    stdout = fh
                else:
                    stdout = subprocess.DEVNULL  # type: ignore[assignment]
            # A group of its own: a signal to the launcher's group reaches it only forwarded.
            procs.append(subprocess.Popen(list(argv), env=env, stdout=stdout, process_group=0))
        return _wait(procs, timeout_s)
    except KeyboardInterrupt:
        _stop(procs)
        return 130
    finally:
        _stop(procs)
        if main:
            signal.signal(signal.SIGTERM, previous)
        for fh in logs:
            fh.close()


def _wait(procs: list[subprocess.Popen[bytes]], timeout_s: float | None) -> int:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    stopped_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        failed = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0, STOPPED)]
        if failed:
            _stop(procs)
            rank, code = failed[0]
            code = code if code > 0 else 128 - code  # killed by a signal: 128 + signum
            print(f"error: rank {rank} exited with status {code}", file=sys.stderr)
            return code
        if all(c is not None for c in codes):
            return STOPPED if STOPPED in codes else 0
        if STOPPED in codes:  # the others stop at the same step, or get stopped
            stopped_at = stopped_at or time.monotonic()
            if time.monotonic() > stopped_at + STOP_GRACE_S:
                _stop(procs)
                return STOPPED
        if deadline is not None and time.monotonic() > deadline:
            _stop(procs)
            print(f"error: ranks still running after {timeout_s:.0f} s; stopped", file=sys.stderr)
            return 124
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
