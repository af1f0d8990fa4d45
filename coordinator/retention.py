"""Retention policies: how long the coordinator keeps what it is sent.

Pure (no database): ``coordinator.config`` builds them from ``coordinator.yaml``
and flags; ``coordinator.pruning`` applies ``IntervalRetention`` and ``JobRetention``,
``coordinator.logpruning`` ``LogRetention``.

``interval_stats`` gets one row per rank per rebalance interval of every job
(256 ranks reporting every second: 0.92 M rows, ~100 MB an hour). An
``IntervalRetention`` bounds it by the age of a row (``received_at_unix_s``):

- younger than ``raw_s``: kept whole;
- between ``raw_s`` and ``keep_s``: thinned: a job's interval is kept only if
  ``end_step // rebalance_interval % thin_every == 0`` (the job's
  ``rebalance_interval``), all its ranks' rows together. The rule depends on the
  step alone, so it keeps the same intervals however often it runs and needs no
  memory of earlier passes; with reports at every boundary (as trainers send
  them) it keeps 1 interval in ``thin_every``;
- older than ``keep_s``: deleted;
- whatever their age, the rows that reports read (the balancer, straggler
  detection) are never pruned: see ``coordinator.pruning``.

Telemetry's policy, ``store.TelemetryPolicy``, lives with the store, which applies
it as nodes report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetero.core.errors import ConfigError

#: The shortest raw window, in seconds: what operators watch (hetero-top, GetJobDetail's
#: newest intervals) stays whole; what reports read is protected whatever the window.
MIN_RAW_S = 60.0
#: Most rows one pruning batch deletes: one short transaction between the writer's others.
BATCH_ROWS = 2_000


@dataclass(frozen=True)
class IntervalRetention:
    """How long interval statistics are kept, in seconds of age since received;
    ``batch_rows``: most rows one pruning batch deletes.

    Error messages name the ``coordinator.yaml`` keys (and ``hetero-coord serve``
    flags) these come from."""

    raw_s: float = 24 * 3600.0
    thin_every: int = 10
    keep_s: float = 30 * 24 * 3600.0
    batch_rows: int = BATCH_ROWS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.raw_s) and self.raw_s >= MIN_RAW_S):
            raise ConfigError(
                f"interval_stats_raw_h: the raw window must be at least {MIN_RAW_S:g} s, "
                f"got {self.raw_s:g} s"
            )
        if isinstance(self.thin_every, bool) or not (
            isinstance(self.thin_every, int) and self.thin_every >= 1
        ):
            raise ConfigError(
                f"interval_stats_thin must be a whole number >= 1, got {self.thin_every!r}"
            )
        if not (math.isfinite(self.keep_s) and self.keep_s >= self.raw_s):
            raise ConfigError(
                f"interval_stats_keep_days ({self.keep_s / 86400:g} d) must be at least the "
                f"raw window, interval_stats_raw_h ({self.raw_s / 3600:g} h)"
            )
        if self.batch_rows < 1:
            raise ConfigError(f"batch_rows must be >= 1, got {self.batch_rows}")

    def keeps(self, end_step: int, rebalance_interval: int) -> bool:
        """True if an interval ending at ``end_step`` survives thinning."""
        return end_step // rebalance_interval % self.thin_every == 0

    def bound_rows(self, rows_per_s: float) -> float:
        """Rows at steady state for ``rows_per_s`` arriving, reports at every boundary."""
        return rows_per_s * (self.raw_s + (self.keep_s - self.raw_s) / self.thin_every)


@dataclass(frozen=True)
class LogRetention:
    """How long the coordinator keeps rank log lines and events, in seconds of age, and
    at most how many log lines one job keeps (its oldest go first). ``batch_rows``:
    most rows one pruning batch deletes.

    A chatty rank ships thousands of lines a second: age alone would let one job
    fill the database within its window, so each job also has a line budget."""

    logs_keep_s: float = 7 * 86400.0
    lines_per_job: int = 200_000
    events_keep_s: float = 30 * 86400.0
    batch_rows: int = BATCH_ROWS

    def __post_init__(self) -> None:
        for key, value in (
            ("log_keep_days", self.logs_keep_s),
            ("event_keep_days", self.events_keep_s),
        ):
            if not (math.isfinite(value) and value >= 3600):
                raise ConfigError(f"{key} must be at least 1/24 (an hour), got {value / 86400:g}")
        if isinstance(self.lines_per_job, bool) or self.lines_per_job < 1000:
            raise ConfigError(f"log_lines_per_job must be >= 1000, got {self.lines_per_job!r}")
        if self.batch_rows < 1:
            raise ConfigError(f"batch_rows must be >= 1, got {self.batch_rows}")


#: The shortest a finished job is kept: it outlives its time in the coordinator's memory
#: (``state.KEEP_FINISHED_S``, an hour) and a day of looking back at it.
MIN_JOB_KEEP_S = 86400.0


@dataclass(frozen=True)
class JobRetention:
    """How long a finished job is kept, in seconds since it finished: then it is deleted
    with its spec, ranks, plans, interval statistics, log lines and events
    (``pruning.prune_finished_jobs``). ``batch_jobs``: most jobs one batch deletes.

    Without it the jobs table only grew: a spec is up to 256 KiB, and a user may
    submit and cancel without end."""

    keep_s: float = 30 * 86400.0
    batch_jobs: int = 100

    def __post_init__(self) -> None:
        if not (math.isfinite(self.keep_s) and self.keep_s >= MIN_JOB_KEEP_S):
            raise ConfigError(f"job_keep_days must be at least 1, got {self.keep_s / 86400:g}")
        if self.batch_jobs < 1:
            raise ConfigError(f"batch_jobs must be >= 1, got {self.batch_jobs}")
