"""Byte caps on the rank log lines the coordinator stores: per job, per user, in all.

Lines used to be counted, not weighed: one job printed 10,000 lines of 4,096 'é'
(82 MB) and the database grew by 86 MB in under 30 s, up to ~1.6 GB a job within
its line budget. Each stored line is now charged what it costs the database
(:func:`line_cost`), and the charge is checked against three caps as the lines
arrive (``AppendJobLogs``), before anything is written: the job's
(``per_job``), its owner's over all their jobs (``per_user``; the owner is the
credential that submitted it, so each shared token is one user) and the
coordinator's (``total``).

**The newest lines are refused; the oldest are kept.** A line that would pass a cap
is dropped with every line after it in its batch, and the job's log gets one note
where the gap begins, kept up to date while the gap grows: ``[hetero-coord] dropped
1.2 MiB (310 lines) here: the job's 64 MiB log cap (log_bytes_per_job)``. Why not a
ring that drops the oldest instead:

- the caps hold at every commit with no delete: a job at its cap costs the writer
  nothing more, where a ring would turn a job that logs as fast as it can into a
  steady insert *and* delete load on the one writer;
- no job's or user's lines are ever evicted by another's appends;
- the tail is not lost: each rank's output is also in its node's rotated files
  (``agent.ranklog``: ``rank<r>.log*``, the newest 256 MiB by default), so the
  database keeps a job's beginning and the node its end.

Room comes back as retention deletes lines (``logpruning``: by age, by line budget,
whole finished jobs); the pruner reports what it freed (:meth:`LogLedger.release`).

Pure: no database. The ledger lives in the coordinator's state (``state``), is
loaded from ``jobs.log_bytes`` at start (``persist.load``) and is changed on the
event loop only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hetero.core.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: What one stored line costs beyond its text, in bytes: its row and index entry
#: (65 bytes on SQLite with an empty text, measured), with room for PostgreSQL's
#: larger tuple headers.
LINE_OVERHEAD_BYTES = 128
#: The smallest per-job cap: a few of the longest lines (4,096 characters of 4 bytes).
MIN_JOB_CAP = 64 * KiB
#: How a coordinator's note in a job's log begins (``supervisor.DROPPED_PREFIX`` is
#: the agent's).
NOTE_PREFIX = "[hetero-coord] "


def line_cost(text_bytes: int) -> int:
    """Bytes a line of ``text_bytes`` UTF-8 bytes is charged against the caps.

    Its text, an eighth more for the pages it spills over (SQLite stores a long line
    in overflow pages: 8,192 bytes take 8,735, 16,384 take 16,929) and
    :data:`LINE_OVERHEAD_BYTES`. SQLite packs rows of 1-4 KB loosely (one row of
    2,100 bytes per 4 KiB page): such lines can cost up to twice their charge, so a
    file holds at most about twice the caps (docs/reliability.md#database-size)."""
    return text_bytes + text_bytes // 8 + LINE_OVERHEAD_BYTES


#: What a note is charged: it says one gap in under 512 bytes (an owner's name is at
#: most 255 characters), whatever its counts grow to.
NOTE_COST = line_cost(512)


def size_text(n: int) -> str:
    """``n`` bytes as people read them: "812 B", "1.2 MiB", "64 MiB"."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class LogCaps:
    """Bytes of stored log lines (as :func:`line_cost` charges them): one job's at most
    ``per_job``, one owner's over all their jobs ``per_user``, every job's ``total``.
    Error messages name the ``coordinator.yaml`` keys."""

    per_job: int = 64 * MiB
    per_user: int = 1 * GiB
    total: int = 8 * GiB

    def __post_init__(self) -> None:
        for key, value in self._keys():
            if isinstance(value, bool) or not isinstance(value, int) or value < MIN_JOB_CAP:
                raise ConfigError(f"{key} must be a whole number of bytes >= {MIN_JOB_CAP}")
        if not self.per_job <= self.per_user <= self.total:
            raise ConfigError(
                f"log caps must grow from job to user to total: log_bytes_per_job "
                f"{self.per_job} <= log_bytes_per_user {self.per_user} <= log_bytes_total "
                f"{self.total}"
            )

    def _keys(self) -> tuple[tuple[str, int], ...]:
        return (
            ("log_bytes_per_job", self.per_job),
            ("log_bytes_per_user", self.per_user),
            ("log_bytes_total", self.total),
        )

    def cause(self, which: str, owner: str) -> str:
        """Why lines were dropped, as the job's note says it."""
        if which == "job":
            return f"the job's {size_text(self.per_job)} log cap (log_bytes_per_job)"
        if which == "user":
            return (
                f"{owner or 'its owner'}'s {size_text(self.per_user)} log cap (log_bytes_per_user)"
            )
        return f"the coordinator's {size_text(self.total)} log cap (log_bytes_total)"


@dataclass
class Gap:
    """Lines of a job dropped since its last stored line, and the note that says so.

    ``text_bytes`` and ``lines`` count what was dropped; ``note_id`` is the note's
    ``seq`` once it is committed (None before); ``rank`` is the first dropped line's."""

    cause: str
    rank: int
    text_bytes: int = 0
    lines: int = 0
    note_id: int | None = None

    def note(self) -> str:
        return (
            f"{NOTE_PREFIX}dropped {size_text(self.text_bytes)} ({self.lines:,} "
            f"line{'s' if self.lines != 1 else ''}) here: {self.cause}; the rank logs on "
            "the nodes (rank<r>.log*) keep the newest"
        )


@dataclass
class JobLog:
    """One job's stored log: its owner, the bytes charged, the gap open now (if any)."""

    owner: str
    stored: int = 0
    gap: Gap | None = None


@dataclass(frozen=True)
class Admitted:
    """What to do with one batch of a job's lines: store the first ``kept``, charged
    ``kept_cost`` bytes; ``gap``: the gap the rest joined (None: nothing dropped), whose
    note is added (``opened``: this batch began it) or rewritten with the new counts."""

    kept: int
    kept_cost: int
    gap: Gap | None = None
    opened: bool = False


@dataclass
class LogLedger:
    """Bytes charged for stored lines, by job, by owner and in all."""

    jobs: dict[str, JobLog] = field(default_factory=dict)
    owners: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def load(self, job_id: str, owner: str, stored: int) -> None:
        """A job's charge as the database holds it (at start)."""
        self._charge(self.jobs.setdefault(job_id, JobLog(owner)), stored)

    def admit(
        self,
        caps: LogCaps,
        job_id: str,
        owner: str,
        lines: Sequence[tuple[int, int]],
    ) -> Admitted:
        """Charge the longest first part of ``lines`` ((rank, UTF-8 bytes) each, in
        order) that fits under every cap; the rest is dropped into the job's gap. The
        gap's note is charged too (:data:`NOTE_COST`, one note a gap: a job passes its
        cap by one note at most)."""
        job = self.jobs.setdefault(job_id, JobLog(owner))
        kept, cost, refused = 0, 0, ""
        for _, size in lines:
            refused = self._refusal(caps, job, cost + line_cost(size))
            if refused:
                break
            kept, cost = kept + 1, cost + line_cost(size)
        self._charge(job, cost)
        if kept:
            job.gap = None  # lines stored again: the gap ended (its note says all of it)
        if kept == len(lines):
            return Admitted(kept, cost)
        opened = job.gap is None
        if job.gap is None:
            job.gap = Gap(caps.cause(refused, owner), rank=lines[kept][0])
            self._charge(job, NOTE_COST)
        for _, size in lines[kept:]:
            job.gap.text_bytes += size
            job.gap.lines += 1
        return Admitted(kept, cost, job.gap, opened)

    def _refusal(self, caps: LogCaps, job: JobLog, cost: int) -> str:
        """Which cap ``cost`` more bytes of ``job`` would pass ("" if none)."""
        if job.stored + cost > caps.per_job:
            return "job"
        if self.owners.get(job.owner, 0) + cost > caps.per_user:
            return "user"
        if self.total + cost > caps.total:
            return "total"
        return ""

    def _charge(self, job: JobLog, cost: int) -> None:
        job.stored += cost
        self.owners[job.owner] = self.owners.get(job.owner, 0) + cost
        self.total += cost

    def release(self, freed: Mapping[str, int]) -> None:
        """Bytes retention deleted, by job (``logpruning``)."""
        for job_id, cost in freed.items():
            job = self.jobs.get(job_id)
            if job is not None:
                self._charge(job, -min(cost, job.stored))

    def forget(self, job_ids: Sequence[str]) -> None:
        """Jobs deleted with all their lines (``pruning``'s finished jobs)."""
        for job_id in job_ids:
            job = self.jobs.pop(job_id, None)
            if job is not None:
                self._charge(job, -job.stored)
                if self.owners.get(job.owner) == 0:
                    del self.owners[job.owner]
