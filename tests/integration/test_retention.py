"""Retention of interval statistics on a real SQLite file, then PostgreSQL: the coordinator's
write operations (``persist``) write jobs and interval reports (dated by hand), ``pruning.prune_batch`` prunes them in
batches of their own transactions, as ``service.Service.prune`` runs it through the writer."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hetero.bench import seed
from hetero.coordinator import lifecycle, persist, store
from hetero.coordinator.config import load_config, with_flags
from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.models import IntervalStatRow
from hetero.coordinator.pruning import PruneState, prune_batch
from hetero.coordinator.reports import HISTORY
from hetero.coordinator.retention import IntervalRetention
from hetero.core.balancer import RankInterval
from hetero.core.errors import ConfigError
from hetero.core.jobspec import parse_jobspec

NOW = 1_700_000_000.0
HOUR = 3600.0
#: Whole for 1 h, then every 4th interval, deleted after 10 h.
POLICY = IntervalRetention(raw_s=HOUR, thin_every=4, keep_s=10 * HOUR)
SPEC = """\
name: kept
model: debug
global_batch: 8
steps: 100000
rebalance_interval: {interval}
resources: {{ranks: {ranks}, device: cpu}}
"""


@pytest.fixture
def sessions(both_stores_url: str) -> Iterator[sessionmaker[Session]]:
    engine = open_database(both_stores_url)
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()


def _job(s: Session, interval: int, ranks: int) -> str:
    """A running job, its row as the coordinator writes it (``persist.save_job``)."""
    text = SPEC.format(interval=interval, ranks=ranks)
    job = seed.queued_job(parse_jobspec(text), text, now=NOW - 40 * HOUR, priority=0, owner="")
    job.state = lifecycle.RUNNING
    seed.save(s, persist.save_job(job, ranks=False))
    return job.id


def _end(s: Session, job_id: str, at: float) -> None:
    """The job cancelled at ``at``: finished, nothing of it protected any more."""
    job = store.get_job(s, job_id)
    job.state, job.finished_at_unix_s = lifecycle.CANCELLED, at


def _report(s: Session, job_id: str, end_step: int, at: float) -> None:
    """Every rank's statistics of the interval ending at ``end_step``, received at ``at``."""
    job = store.get_job(s, job_id)
    ranks = tuple(
        RankInterval(rank=r, batch=8, steps=5, compute_s=0.5, step_s=0.6)
        for r in range(job.world_size)
    )
    seed.save(s, seed.interval_rows(job_id, (end_step, ranks), job.attempt_first_plan, at))


def _kept(sessions: sessionmaker[Session], job_id: str) -> dict[int, int]:
    """end_step -> rows left."""
    with sessions() as s:
        steps = s.scalars(select(IntervalStatRow.end_step).where(IntervalStatRow.job_id == job_id))
        out: dict[int, int] = {}
        for step in steps:
            out[step] = out.get(step, 0) + 1
        return out


def _prune_all(
    sessions: sessionmaker[Session], policy: IntervalRetention, state: PruneState, now: float
) -> tuple[int, PruneState]:
    removed = 0
    while True:
        with sessions.begin() as s:
            batch = prune_batch(s, policy, state, now=now)
        removed, state = removed + batch.removed, batch.state
        if not batch.more:
            return removed, state


def test_old_rows_are_deleted_older_ones_thinned_per_job_and_recent_ones_kept_whole(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as s:
        a, b = _job(s, interval=5, ranks=2), _job(s, interval=3, ranks=1)
        _end(s, a, NOW)  # finished jobs: nothing protected
        _end(s, b, NOW)
        # One report of each job every 10 minutes over the last 12 h, oldest first.
        for k in range(72):
            at = NOW - 12 * HOUR + k * 600
            _report(s, a, 5 * (k + 1), at)
            _report(s, b, 3 * (k + 1), at)
    removed, state = _prune_all(sessions, POLICY, PruneState(), NOW)

    def expected(interval: int, ranks: int) -> dict[int, int]:
        out = {}
        for k in range(72):
            at, step = NOW - 12 * HOUR + k * 600, interval * (k + 1)
            if at < NOW - 10 * HOUR:
                continue  # older than keep_s
            if at < NOW - HOUR and not POLICY.keeps(step, interval):
                continue  # thinned
            out[step] = ranks
        return out

    kept_a, kept_b = _kept(sessions, a), _kept(sessions, b)
    assert kept_a == expected(5, 2) and kept_b == expected(3, 1)
    assert removed == 72 * 3 - sum(kept_a.values()) - sum(kept_b.values())
    # The last hour whole; 9 h thinned to every 4th interval of each job's own steps.
    assert [step for step in kept_a if step > 5 * 66] == [5 * k for k in range(67, 73)]
    assert [step for step in kept_b if step <= 3 * 66] == list(range(48, 3 * 66 + 1, 12))
    # The rule depends on the step alone: pruning again, or from scratch as after a
    # coordinator restart, removes nothing more.
    assert _prune_all(sessions, POLICY, state, NOW)[0] == 0
    assert _prune_all(sessions, POLICY, PruneState(), NOW)[0] == 0


def test_a_running_jobs_newest_intervals_are_never_pruned_until_newer_ones_replace_them(
    sessions: sessionmaker[Session],
) -> None:
    """Intervals of 30 minutes: the window of HISTORY intervals that reports
    read (balancer, straggler detection) reaches far beyond the raw minute, and its
    oldest beyond keep_s."""
    policy = IntervalRetention(raw_s=60.0, thin_every=4, keep_s=14 * HOUR)
    n = HISTORY + 8
    times = [NOW - (n - 1 - k) * 1800 for k in range(n)]
    with sessions.begin() as s:
        job_id = _job(s, interval=5, ranks=2)
        for k, at in enumerate(times):
            _report(s, job_id, 5 * (k + 1), at)
    with sessions() as s:
        history = store.interval_history(s, store.get_job(s, job_id), HISTORY)
    state = _prune_all(sessions, policy, PruneState(), NOW)[1]
    assert NOW - times[8] > policy.keep_s and NOW - times[7] > policy.keep_s, "the setup"
    # Outside the window every row is past keep_s: gone. Inside it nothing is.
    assert _kept(sessions, job_id) == {5 * (k + 1): 2 for k in range(8, n)}
    with sessions() as s:
        after = store.interval_history(s, store.get_job(s, job_id), HISTORY)
    assert after == history, "what reports read is untouched"
    assert state.deferred, "the thinning walk passed protected rows and remembers them"

    # Eight intervals a minute apart push the window's oldest eight out of it: pruned
    # like any other row (past keep_s: deleted; else thinned).
    times += [NOW + j * 60 for j in range(1, 9)]
    with sessions.begin() as s:
        for k in range(n, n + 8):
            _report(s, job_id, 5 * (k + 1), times[k])
    later = times[-1]
    state = _prune_all(sessions, policy, state, later)[1]
    released = [
        5 * (k + 1)
        for k in range(8, 16)
        if later - times[k] < policy.keep_s and policy.keeps(5 * (k + 1), 5)
    ]
    assert released, "the setup: some of the released rows are young enough to thin"
    assert _kept(sessions, job_id) == {
        step: 2 for step in [*released, *range(85, 5 * (n + 8) + 1, 5)]
    }

    # The job ends: only the age rules are left.
    with sessions.begin() as s:
        _end(s, job_id, later)
    state = _prune_all(sessions, policy, state, later)[1]
    assert not state.deferred
    assert _kept(sessions, job_id) == {
        5 * (k + 1): 2
        for k, at in enumerate(times)
        if later - at < policy.keep_s
        and (later - at < policy.raw_s or policy.keeps(5 * (k + 1), 5))
    }


def test_each_batch_deletes_at_most_batch_rows_and_the_batches_finish_the_job(
    sessions: sessionmaker[Session],
) -> None:
    policy = IntervalRetention(raw_s=HOUR, thin_every=4, keep_s=10 * HOUR, batch_rows=25)
    times = (
        [NOW - 11 * HOUR + k for k in range(80)]  # past keep_s
        + [NOW - 5 * HOUR + k for k in range(60)]  # to thin
        + [NOW - 600 + k for k in range(60)]  # recent
    )
    with sessions.begin() as s:
        job_id = _job(s, interval=1, ranks=3)
        _end(s, job_id, NOW)
        for k, at in enumerate(times):
            _report(s, job_id, k + 1, at)
    state, batches, removed = PruneState(), 0, 0
    while True:
        with sessions.begin() as s:
            batch = prune_batch(s, policy, state, now=NOW)
        assert batch.removed <= 25
        state, batches, removed = batch.state, batches + 1, removed + batch.removed
        if not batch.more:
            break
    thinned = [step for step in range(81, 141) if step % 4 == 0]
    assert _kept(sessions, job_id) == dict.fromkeys([*thinned, *range(141, 201)], 3)
    assert removed == 600 - 3 * (len(thinned) + 60) and batches >= removed / 25


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"raw_s": 59.0}, "interval_stats_raw_h: the raw window must be at least 60 s"),
        ({"raw_s": math.nan}, "interval_stats_raw_h"),
        ({"thin_every": 0}, "interval_stats_thin must be a whole number >= 1, got 0"),
        ({"thin_every": 2.5}, "interval_stats_thin"),
        ({"raw_s": 2 * 86400.0, "keep_s": 86400.0}, "interval_stats_keep_days (1 d) must be"),
        ({"keep_s": math.inf}, "interval_stats_keep_days"),
    ],
)
def test_a_bad_policy_is_a_config_error_naming_its_key(
    fields: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        IntervalRetention(**fields)  # type: ignore[arg-type]
    assert message in str(info.value) and "\n" not in str(info.value)


def test_coordinator_yaml_and_flags_set_both_retention_policies(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.yaml"
    path.write_text(
        "telemetry_retention_h: 2\ninterval_stats_raw_h: 6\n"
        "interval_stats_thin: 5\ninterval_stats_keep_days: 7\n"
    )
    config = load_config(path)
    assert config.telemetry_retention_h == 2
    assert config.interval_retention == IntervalRetention(
        raw_s=6 * HOUR, thin_every=5, keep_s=7 * 86400.0
    )
    flagged = with_flags(config, interval_stats_thin=1, telemetry_retention_h=None)
    assert flagged.interval_retention.thin_every == 1 and flagged.telemetry_retention_h == 2
    with pytest.raises(ConfigError, match="interval_stats_keep_days"):
        with_flags(config, interval_stats_keep_days=0.1)
    with pytest.raises(ConfigError, match="telemetry_retention_h must be at least"):
        with_flags(config, telemetry_retention_h=0.001)
    path.write_text("interval_stats_thin: 0\n")
    with pytest.raises(ConfigError, match="interval_stats_thin"):
        load_config(path)
