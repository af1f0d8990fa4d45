"""Following a standalone run's output directory: the files ``hetero-train`` and ``ht.init``
write, read incrementally as they grow.

A run directory holds ``metrics/rank<R>.jsonl`` (one record per rebalance
interval and rank, ``hetero.trainer.metrics``), ``metrics/eval.jsonl`` (one
record per evaluation, ``Context.evaluate``), ``metrics/run.json`` (what the run
is, from its first boundary on) and, once a ``hetero-train`` run has finished,
``summary.json``. :class:`RunFollower` keeps a byte offset per
file and parses only whole lines past it, so a record being written is read
on the next poll, never half; a file that shrank (a new run in the same
directory) is read again from the start. A line that is not JSON is counted
and skipped: the view degrades, it does not stop. The reader uses the standard
library only; :class:`RunFiles` is an immutable snapshot the UI thread reads.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero.core.errors import ConfigError

Record = Mapping[str, Any]

METRICS_DIR = "metrics"
EVAL_FILE = "eval.jsonl"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
_RANK_FILE = re.compile(r"rank(\d+)\.jsonl")
#: Records kept per file: a long run's view shows its most recent intervals.
MAX_RECORDS = 2000


@dataclass(frozen=True)
class RunFiles:
    """What a run directory held at ``read_at_unix_s``: records per rank, oldest first."""

    path: Path
    ranks: tuple[tuple[Record, ...], ...] = ()
    evals: tuple[Record, ...] = ()
    #: ``metrics/run.json``: policy, world size, device, pid, ``ended_unix_s`` once closed.
    info: Record | None = None
    #: ``summary.json`` once the run wrote it (a finished ``hetero-train`` run).
    summary: Record | None = None
    read_at_unix_s: float = 0.0
    #: Modification time of the newest file, Unix seconds (0: nothing written yet).
    updated_unix_s: float = 0.0
    #: Lines that were not JSON objects, over all files (skipped).
    bad_lines: int = 0

    @property
    def finished(self) -> bool:
        """The run wrote its summary, or closed its context."""
        return self.summary is not None or bool(self.info and self.info.get("ended_unix_s"))

    @property
    def intervals(self) -> int:
        return min((len(r) for r in self.ranks), default=0)


@dataclass
class _Tail:
    """One JSON-lines file read up to ``offset`` (the byte after the last whole line)."""

    path: Path
    offset: int = 0
    records: list[Record] = field(default_factory=list)
    bad: int = 0

    def poll(self) -> bool:
        """Read the whole lines added since the last poll; True if any record was added."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return False
        if size < self.offset:  # truncated or replaced: a new run writes here
            self.offset, self.records, self.bad = 0, [], 0
        if size == self.offset:
            return False
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(size - self.offset)
        except OSError:
            return False
        end = chunk.rfind(b"\n")
        if end < 0:
            return False  # a record still being written
        self.offset += end + 1
        added = False
        for line in chunk[:end].splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                self.records.append(record)
                added = True
            else:
                self.bad += 1
        del self.records[:-MAX_RECORDS]
        return added


@dataclass
class _JsonFile:
    """A JSON object file rewritten whole; read again when its modification time moves."""

    path: Path
    value: Record | None = None
    mtime: float = 0.0

    def poll(self) -> bool:
        mtime = _mtime(self.path)
        if not mtime or mtime == self.mtime:
            return False
        try:
            value = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False  # being written: read it next time
        if not isinstance(value, dict):
            return False
        self.value, self.mtime = value, mtime
        return True


class RunFollower:
    """Reads a run directory again on each :meth:`poll`, only what was added."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--run {self.path}: not a directory")
        self._ranks: dict[int, _Tail] = {}
        self._eval = _Tail(self.path / METRICS_DIR / EVAL_FILE)
        self._info = _JsonFile(self.path / METRICS_DIR / RUN_FILE)
        self._summary = _JsonFile(self.path / SUMMARY_FILE)
        self._files = RunFiles(self.path)

    def poll(self) -> RunFiles:
        """The directory now; the same object as before when nothing changed."""
        changed = False
        for rank, p in _rank_files(self.path / METRICS_DIR):
            changed |= self._ranks.setdefault(rank, _Tail(p)).poll()
        changed |= self._eval.poll()
        changed |= self._info.poll()
        changed |= self._summary.poll()
        if not changed and self._files.read_at_unix_s:
            return self._files
        tails = (*self._ranks.values(), self._eval)
        newest = max([_mtime(t.path) for t in tails] + [self._info.mtime, self._summary.mtime])
        self._files = RunFiles(
            path=self.path,
            ranks=tuple(tuple(self._ranks[r].records) for r in sorted(self._ranks)),
            evals=tuple(self._eval.records),
            info=self._info.value,
            summary=self._summary.value,
            read_at_unix_s=time.time(),
            updated_unix_s=newest,
            bad_lines=sum(t.bad for t in tails),
        )
        return self._files


def _rank_files(metrics: Path) -> list[tuple[int, Path]]:
    try:
        names = [p for p in metrics.iterdir() if p.is_file()]
    except OSError:
        return []
    out = []
    for p in names:
        m = _RANK_FILE.fullmatch(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
