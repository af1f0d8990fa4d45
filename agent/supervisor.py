"""Worker processes: start ranks from launch orders, capture their output, stop and reap them.

Each rank runs in its own session (process group), so a stop reaches its data
loader workers too: SIGTERM to the group, SIGKILL after the grace period; a
rank that exits takes its group with it. On Linux each rank also gets
``PR_SET_PDEATHSIG``: if the agent dies without cleaning up (SIGKILL, OOM),
the kernel kills the rank; what the rank started is ended by the agent's next
start from the records of ``agent.leftovers``, so nothing is orphaned.

The death signal is set by a few lines of Python the rank's process runs before
it execs the rank's program (``_EXEC_RANK``), not by a ``preexec_fn``:
the agent is a threaded gRPC process, and a ``preexec_fn`` makes ``subprocess``
fork it whole and run the at-fork handlers of gRPC's threads in the child, which
then aborted now and then before the rank's program began ("Mutex::Fer with
pending CondVar"); without one ``subprocess`` uses ``vfork``, which runs none.

An agent running as root with a ``rank_user`` (``security.permissions.RankUser``)
starts every rank as that account, in the same lines: the rank then reads none
of the agent's files (its token file, its state directory) and may gain no
privilege. Its working directory ``<state>/jobs/<job>/rank<r>`` is then the
rank user's (0700), and the directories above it let others pass (o+x) but not
list; the rank logs beside it stay the agent's (0640).

Output lines go to ``<state>/jobs/<job>/rank<r>.log`` (capped and rotated:
``agent.ranklog``) and to a queue the agent ships to the coordinator with
``AppendJobLogs``. The queue is bounded; a line it has no room for is dropped
and counted, and the next lines shipped for that rank begin with
``[hetero-agent] N lines dropped ... (REASON)``, so a gap is never silent and says
why: the queue was full, or the coordinator refused them (``agent.shipper``).

Watchdog: a rank shows progress by printing a line or by touching its progress
file (the trainer does so as it steps, ``HETERO_PROGRESS_FILE``). One silent
for ``watchdog_s`` is stuck — a collective on a dead peer that its timeout did
not end, a deadlock — and is killed (SIGKILL to its group) and reported as
failed, so the job restarts instead of hanging.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hetero.agent.leftovers import RankRecords
from hetero.agent.ranklog import RankLog, RankLogLimits
from hetero.security.permissions import RankUser

log = logging.getLogger("hetero.agent.supervisor")

#: Longest log line shipped, in characters; longer lines are cut.
MAX_LINE_CHARS = 4096
#: Lines kept for shipping per job while the coordinator is unreachable.
MAX_PENDING_LINES = 20_000
#: How a note about dropped lines begins (it is itself never counted as dropped).
DROPPED_PREFIX = "[hetero-agent] "
#: Why lines were dropped when the queue had no room for them.
QUEUE_FULL = "the agent's queue was full"

#: Run as ``python -I -S -c CODE AGENT_PID USER PROGRAM ARGV...`` in the rank's process.
#: USER is ``-`` (the agent's) or ``UID:GID:GROUP,GROUP``: the rank then takes those
#: ids and groups and may gain no privilege (``PR_SET_NO_NEW_PRIVS``, 38: no set-uid
#: program). Then: ask for SIGKILL when the agent dies (``PR_SET_PDEATHSIG``, 1; after
#: the switch, which clears it), give up if the agent is gone already, put back the
#: signal defaults Python changed (an ignored SIGPIPE would outlive the exec) and
#: become the rank's program; one line and 126 or 127 if any of it fails.
_EXEC_RANK = """\
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
agent, user, program = int(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    if user != "-":
        uid, gid, groups = user.split(":")
        os.setgroups([int(g) for g in groups.split(",") if g])
        os.setresgid(int(gid), int(gid), int(gid))
        os.setresuid(int(uid), int(uid), int(uid))
        if libc.prctl(38, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
except OSError as exc:
    sys.stderr.write(f"hetero-agent: cannot run as {user}: {exc.strerror}\\n")
    os._exit(126)
libc.prctl(1, signal.SIGKILL)
if os.getppid() != agent:
    os._exit(128 + signal.SIGKILL)
for name in ("SIGPIPE", "SIGXFSZ"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execv(program, sys.argv[4:])
except OSError as exc:
    sys.stderr.write(f"hetero-agent: cannot start {program}: {exc.strerror}\\n")
    os._exit(127)
"""


def _program(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> str:
    """The file ``argv[0]`` names, found as ``subprocess`` would (the rank's ``PATH``, a
    path with a slash from ``cwd``). Raises ``FileNotFoundError`` or ``PermissionError``."""
    name = argv[0]
    if os.sep in name:
        path = str(cwd / name)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
        return path
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
    return str(Path(cwd, found))


def _exec_argv(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, user: RankUser | None
) -> list[str]:
    """``argv`` run so that the rank dies with the agent, as ``user`` if given (Linux);
    unchanged elsewhere."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    who = "-"
    if user is not None:
        who = f"{user.uid}:{user.gid}:{','.join(str(g) for g in user.groups)}"
    program = _program(argv, env, cwd)
    return [sys.executable, "-I", "-S", "-c", _EXEC_RANK, str(os.getpid()), who, program, *argv]


@dataclass(frozen=True)
class Line:
    job_id: str
    rank: int
    stream: str  # "stdout" or "stderr"
    text: str
    time_unix_s: float


@dataclass(frozen=True)
class Exit:
    """A rank that ended. ``code`` follows the shell: 128 + signal number if killed."""

    job_id: str
    rank: int
    code: int
    stopped: bool  # ended because the agent stopped it
    attempt: int = 0
    #: Why the agent ended it, e.g. "watchdog: no progress for 30 s"; "" otherwise.
    reason: str = ""


@dataclass
class Worker:
    job_id: str
    rank: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    logfile: RankLog
    readers: list[threading.Thread] = field(default_factory=list)
    #: perf_counter deadline after which a stopping worker gets SIGKILL; None = not stopping.
    kill_at: float | None = None
    attempt: int = 0
    #: File the rank touches as it makes progress (None: output lines only).
    progress_file: Path | None = None
    #: perf_counter time of the last output line (or the launch).
    last_output: float = field(default_factory=time.perf_counter)
    #: Set when the watchdog killed it.
    reason: str = ""
    #: The device it was launched on ("cuda:0", "cpu:0"; "" if not said).
    device: str = ""

    @property
    def stopping(self) -> bool:
        return self.kill_at is not None

    def silent_s(self, now: float) -> float:
        """Seconds since the rank last printed or touched its progress file."""
        last = self.last_output
        if self.progress_file is not None:
            with contextlib.suppress(OSError):
                age = time.time() - self.progress_file.stat().st_mtime
                last = max(last, now - max(age, 0.0))
        return now - last


class Supervisor:
    """Owns the rank processes of one agent. Call methods from one thread (the agent loop)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        clock: Callable[[], float] = time.time,
        log_limits: RankLogLimits | None = None,
        max_pending_lines: int = MAX_PENDING_LINES,
        rank_user: RankUser | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.jobs_dir = state_dir / "jobs"
        #: Who ranks run as; None: the agent's own user.
        self.rank_user = rank_user
        self.clock = clock
        self.log_limits = log_limits or RankLogLimits()
        #: Every running rank, on disk: what a restarted agent ends (``agent.leftovers``).
        self.records = RankRecords(state_dir)
        self.workers: dict[tuple[str, int], Worker] = {}
        self._lines: collections.deque[Line] = collections.deque(maxlen=max_pending_lines)
        #: Lines dropped per (job, rank, reason) since the last note about them was queued.
        self._dropped: collections.Counter[tuple[str, int, str]] = collections.Counter()
        #: Every line dropped since start (the agent's log says so at shutdown).
        self.dropped_total = 0
        self._lock = threading.Lock()

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def _hand_over(self, cwd: Path) -> None:
        """Make ``cwd`` the rank user's own (0700), reachable through directories others
        may pass (o+x) but neither list nor write, from the state directory down; the
        owner's and group's bits stay as they were."""
        assert self.rank_user is not None
        if self.state_dir in cwd.parents:
            for path in cwd.parents:
                path.chmod(stat.S_IMODE(path.stat().st_mode) & ~stat.S_IRWXO | stat.S_IXOTH)
                if path == self.state_dir:
                    break
        os.chown(cwd, self.rank_user.uid, self.rank_user.gid)
        cwd.chmod(0o700)

    def _home(self, cwd: Path) -> str:
        """The rank user's home where it exists, else the rank's working directory
        (``nobody``'s is ``/nonexistent``)."""
        assert self.rank_user is not None
        return self.rank_user.home if os.path.isdir(self.rank_user.home) else str(cwd)

    def pids(self) -> set[int]:
        """Pids of the running ranks; safe to call from the telemetry thread (the copy
        of the dict's values is taken under the GIL in one step)."""
        return {w.proc.pid for w in tuple(self.workers.values())}

    def running(self, job_id: str, rank: int) -> bool:
        return (job_id, rank) in self.workers

    def attempt_of(self, job_id: str, rank: int) -> int | None:
        """The attempt of the rank running here, or None."""
        worker = self.workers.get((job_id, rank))
        return None if worker is None else worker.attempt

    def launch(
        self,
        job_id: str,
        rank: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        *,
        attempt: int = 0,
        progress_file: Path | None = None,
        device: str = "",
    ) -> None:
        """Start one rank on ``device``. Raises ``OSError`` if the program cannot be started."""
        job_dir = self.job_dir(job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        if self.rank_user is not None:
            self._hand_over(cwd)
            env = {**env, "HOME": self._home(cwd)}
            env.update(USER=self.rank_user.name, LOGNAME=self.rank_user.name)
        log_path = job_dir / f"rank{rank}.log"
        proc = subprocess.Popen(
            _exec_argv(argv, env, cwd, self.rank_user),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.records.record(job_id, rank, attempt, proc.pid)
        if progress_file is not None:
            progress_file.unlink(missing_ok=True)  # an earlier attempt's file is no progress
        worker = Worker(
            job_id,
            rank,
            proc,
            log_path,
            RankLog(log_path, self.log_limits),
            attempt=attempt,
            progress_file=progress_file,
            device=device,
        )
        assert proc.stdout is not None and proc.stderr is not None
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            t = threading.Thread(
                target=self._read,
                args=(worker, stream, pipe),
                name=f"log-{job_id}-{rank}-{stream}",
                daemon=True,
            )
            t.start()
            worker.readers.append(t)
        self.workers[(job_id, rank)] = worker
        log.info("job %s rank %d started as pid %d: %s", job_id, rank, proc.pid, " ".join(argv))

    def _read(self, worker: Worker, stream: str, pipe: IO[bytes]) -> None:
        prefix = "" if stream == "stdout" else "[stderr] "
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            worker.logfile.write(prefix + text)  # whole, rotated; a full disk is counted
            worker.last_output = time.perf_counter()
            line = Line(worker.job_id, worker.rank, stream, text[:MAX_LINE_CHARS], self.clock())
            with self._lock:
                if len(self._lines) == self._lines.maxlen:  # the oldest line makes room
                    self._count_dropped(self._lines[0])
                self._lines.append(line)
        pipe.close()

    def _count_dropped(self, line: Line, reason: str = QUEUE_FULL) -> None:
        self._dropped[(line.job_id, line.rank, reason)] += 1
        self.dropped_total += 1

    def take_lines(self) -> list[Line]:
        """Every line captured since the last call, oldest first; a rank whose lines were
        dropped since the last call gets a note first saying how many."""
        with self._lock:
            lines = list(self._lines)
            self._lines.clear()
            dropped, self._dropped = self._dropped, collections.Counter()
        now = self.clock()
        notes = [
            Line(job_id, rank, "stderr", _dropped_note(n, rank, reason), now)
            for (job_id, rank, reason), n in sorted(dropped.items())
        ]
        return notes + lines

    def put_back(self, lines: Sequence[Line]) -> None:
        """Return unshipped lines to the front of the queue; what does not fit beside the
        newer lines is dropped, oldest first, and counted."""
        with self._lock:
            room = (self._lines.maxlen or 0) - len(self._lines)
            excess = max(len(lines) - room, 0)
            for line in lines[:excess]:
                if not line.text.startswith(DROPPED_PREFIX):
                    self._count_dropped(line)
            self._lines.extendleft(reversed(lines[excess:]))

    def count_dropped(self, lines: Sequence[Line], reason: str) -> None:
        """Count ``lines`` as dropped for ``reason`` ("refused by the coordinator: ..."):
        noted like the rest."""
        with self._lock:
            for line in lines:
                if not line.text.startswith(DROPPED_PREFIX):
                    self._count_dropped(line, reason)

    def stop(self, job_id: str, rank: int, grace_s: float) -> bool:
        """Ask a rank to stop (SIGTERM to its group); False if it is not running here."""
        worker = self.workers.get((job_id, rank))
        if worker is None:
            return False
        if worker.kill_at is None:
            worker.kill_at = time.perf_counter() + grace_s
            _signal_group(worker.proc, signal.SIGTERM)
            log.info("job %s rank %d: SIGTERM (SIGKILL in %.0f s)", job_id, rank, grace_s)
        return True

    def poll(self) -> list[Exit]:
        """Reap ended ranks and SIGKILL those past their grace period."""
        ended = []
        now = time.perf_counter()
        for key, worker in list(self.workers.items()):
            code = worker.proc.poll()
            if code is None:
                if worker.kill_at is not None and now >= worker.kill_at:
                    _signal_group(worker.proc, signal.SIGKILL)
                continue
            # The group may still hold children (data loader workers): end them too.
            _signal_group(worker.proc, signal.SIGKILL)
            for t in worker.readers:
                t.join(timeout=1.0)
            worker.logfile.close()
            self.records.forget(worker.job_id, worker.rank)
            del self.workers[key]
            shell_code = code if code >= 0 else 128 - code
            stopped = worker.kill_at is not None and not worker.reason
            ended.append(
                Exit(worker.job_id, worker.rank, shell_code, stopped, worker.attempt, worker.reason)
            )
            log.info("job %s rank %d exited with %d", worker.job_id, worker.rank, shell_code)
        return ended

    def watchdog(self, watchdog_s: float) -> list[tuple[str, int, float]]:
        """Kill every rank silent for ``watchdog_s`` (not already stopping); returns
        (job, rank, silent seconds) of each. ``poll`` then reports them with a reason."""
        killed = []
        now = time.perf_counter()
        for worker in self.workers.values():
            if worker.kill_at is not None:
                continue
            silent = worker.silent_s(now)
            if silent < watchdog_s:
                continue
            worker.reason = f"watchdog: no progress for {silent:.0f} s"
            worker.kill_at = now
            _signal_group(worker.proc, signal.SIGKILL)
            log.warning("job %s rank %d: %s, killed", worker.job_id, worker.rank, worker.reason)
            killed.append((worker.job_id, worker.rank, silent))
        return killed

    def stop_all(self, grace_s: float) -> list[Exit]:
        """Stop every rank and wait for all of them (SIGKILL after ``grace_s``)."""
        for job_id, rank in list(self.workers):
            self.stop(job_id, rank, grace_s)
        ended: list[Exit] = []
        deadline = time.perf_counter() + grace_s + 5.0
        while self.workers and time.perf_counter() < deadline:
            ended.extend(self.poll())
            time.sleep(0.05)
        return ended


def _dropped_note(n: int, rank: int, reason: str) -> str:
    return (
        f"{DROPPED_PREFIX}{n} line{'s' if n != 1 else ''} dropped before shipping "
        f"({reason}); rank{rank}.log* on the node have them"
    )


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
