"""Rank processes a killed agent left behind: recorded at launch, ended at the next start.

Each rank leads its own session, and the kernel ends the leader when the agent
dies (``PR_SET_PDEATHSIG``); but its children — data loader workers, a
user's subprocesses — are reparented to init and would run on after a
``kill -9`` of the agent, beside a job already marked failed. So every launch
writes ``<state>/ranks/<job>.<rank>.json`` (leader pid, its start time, the
attempt), removed when the rank is reaped; an agent that starts and finds such
records ends every process still in those sessions and reports the ranks as
exited, so the coordinator restarts or fails their jobs instead of waiting.

A session id is the leader's pid, which the kernel does not hand out again
while the session has members, so members of session ``pid`` whose start is
not before the leader's are the rank's (a process only of this agent's user
can be signalled anyway). A process that left the session on purpose
(``setsid``, a daemon) is not found: that takes a cgroup (the systemd unit's
``KillMode``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

log = logging.getLogger("hetero.agent.leftovers")

#: Seconds the agent waits for killed leftovers to be gone.
END_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RankRecord:
    """A rank this agent launched: ``pid`` leads its session, started at ``started_unix_s``."""

    job_id: str
    rank: int
    attempt: int
    pid: int
    started_unix_s: float


class RankRecords:
    """The ``ranks/`` folder of an agent's state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "ranks"

    def _path(self, job_id: str, rank: int) -> Path:
        return self.dir / f"{job_id}.{rank}.json"

    def record(self, job_id: str, rank: int, attempt: int, pid: int) -> None:
        """Note a launched rank (atomically: a record is whole or absent)."""
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            return  # already gone: nothing can be left of it
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(job_id, rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(RankRecord(job_id, rank, attempt, pid, started))))
        os.replace(tmp, path)

    def forget(self, job_id: str, rank: int) -> None:
        self._path(job_id, rank).unlink(missing_ok=True)

    def records(self) -> list[RankRecord]:
        found = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                found.append(RankRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                log.warning("unreadable rank record %s: removed", path)
                path.unlink(missing_ok=True)
        return found

    def end_leftovers(self, timeout_s: float = END_TIMEOUT_S) -> list[tuple[RankRecord, int]]:
        """SIGKILL every process left in a recorded rank's session, wait up to ``timeout_s``
        for them to be gone, and clear the records. Returns each record with the number
        of its processes that were ended."""
        ended = []
        for rec in self.records():
            procs = _session_members(rec)
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
            _, alive = psutil.wait_procs(procs, timeout=timeout_s)
            if alive:
                log.error(
                    "job %s rank %d: %d leftover processes survived SIGKILL: %s",
                    rec.job_id,
                    rec.rank,
                    len(alive),
                    [p.pid for p in alive],
                )
            self.forget(rec.job_id, rec.rank)
            ended.append((rec, len(procs)))
        return ended


def _session_members(rec: RankRecord) -> list[psutil.Process]:
    """The processes of ``rec``'s session (its leader included if alive and the same)."""
    with contextlib.suppress(psutil.Error):
        leader = psutil.Process(rec.pid)
        if abs(leader.create_time() - rec.started_unix_s) > 0.05:
            return []  # the pid was handed out again: that session is someone else's
    members = []
    for p in psutil.process_iter(["create_time"]):
        if p.pid == os.getpid():
            continue
        try:
            same = os.getsid(p.pid) == rec.pid or os.getpgid(p.pid) == rec.pid
        except OSError:
            continue
        if same and (p.info["create_time"] or 0.0) >= rec.started_unix_s - 0.05:
            members.append(p)
    return members
