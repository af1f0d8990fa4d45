"""What the gap breakdown reads: step phase times per interval and each rank alone.

``IntervalTimes`` holds one interval of the whole job (every rank's input wait,
compute, communication and optimizer seconds per step, the interval's wall
time); ``Solo`` one rank's measurement alone at its batch (the ideal's). Read
from the metrics records a run writes (``metrics/rank<R>.jsonl``: hetero's and
the plain-DDP baselines' share the field names) and from a run's summary; the
trainer builds them from its interval summaries. Standard library only.

Every phase is a **mean** over the same settled steps, so a rank's phases add up
to its mean settled step (``RankTimes.step_s``). The recorded ``step_s`` is a
median, which leaves out the rare long step: on the DataLoader path a batch
that takes the workers much longer than a step arrives in bursts, and the
median step (79 ms in one ResNet-50 run) was far below the mean (135 ms).
The helpers at the end are per-interval facts both the window's breakdown
(``hetero.core.gap``) and the whole-run account (``hetero.core.wholerun``) use.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class RankTimes:
    """One rank's seconds per step, means over one interval's settled steps.

    With compute-only time (hetero's trainer) ``step_s`` = data + compute + comm +
    optimizer exactly; under plain DDP ``compute_s`` and ``comm_s`` are ``None`` (its
    backward includes the wait for peers) and ``step_s`` is the mean step.
    ``None`` everywhere but ``batch``: the rank timed no settled step."""

    batch: int
    data_s: float | None = None
    compute_s: float | None = None  # forward + backward until the last bucket was ready
    optimizer_s: float | None = None
    step_s: float | None = None  # the mean settled step
    comm_s: float | None = None  # gradients ready → all-reduce done: peers' lateness included
    #: Seconds the loader's workers need to make one batch, per step (their busy time
    #: over their count); ``None`` where batches are made on the training thread or the
    #: record predates the field. Read by the verdict only, never by the identity.
    input_s: float | None = None

    @classmethod
    def of_phases(
        cls,
        batch: int,
        data: float,
        forward: float,
        backward: float,
        comm: float,
        optimizer: float,
    ) -> RankTimes:
        """From hetero's phase means (``phases_s`` of a record, or a ``RankSummary``)."""
        compute = forward + backward
        return cls(batch, data, compute, optimizer, data + compute + comm + optimizer, comm)

    @property
    def busy_s(self) -> float | None:
        """Input wait + compute + optimizer; ``None`` without compute-only time (plain DDP)."""
        if self.compute_s is None:
            return None
        return self.compute_s + (self.data_s or 0.0) + (self.optimizer_s or 0.0)


@dataclass(frozen=True)
class IntervalTimes:
    """One interval (the steps up to ``end_step``) of the whole job, every rank's times."""

    end_step: int
    steps: int
    wall_s: float
    ranks: tuple[RankTimes, ...]
    measured: bool = True  # False: some rank had no settled step to time

    @property
    def plan(self) -> tuple[int, ...]:
        return tuple(r.batch for r in self.ranks)

    @property
    def wall_per_step_s(self) -> float:
        return self.wall_s / self.steps


@dataclass(frozen=True)
class Solo:
    """One rank alone at ``batch`` (the ideal's measurement): samples/s and phase seconds."""

    batch: int
    samples_per_s: float
    data_s: float | None = None
    compute_s: float | None = None
    optimizer_s: float | None = None

    @property
    def step_s(self) -> float:
        return self.batch / self.samples_per_s


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def rank_times(record: Mapping[str, Any]) -> RankTimes:
    """One rank's times from its metrics record.

    hetero's records (``compute_s`` and ``phases_s`` with data, forward, backward, comm,
    optimizer) give phase means that add up. Plain DDP's (``compute_s`` null) give
    ``step_s`` as the sum of their phases (data, [forward,] backward, optimizer), or the
    recorded mean step. hetero records without forward/backward (older runs) keep
    ``compute_s`` and the median ``step_s``; the communication is what the step leaves of
    the busy time, at least 0, so the phases still add up to ``step_s``."""
    phases = record.get("phases_s") or {}
    batch = int(record.get("batch") or 0)
    got = {k: _num(phases.get(k)) for k in ("data", "forward", "backward", "comm", "optimizer")}
    data = got["data"] if got["data"] is not None else _num(record.get("data_s"))
    optimizer = got["optimizer"]
    if optimizer is None:
        optimizer = _num(record.get("optimizer_s"))
    step = _num(record.get("step_s"))
    loader = _num(record.get("input_s"))
    if record.get("compute_s") is None:  # plain DDP
        parts = [v for v in got.values() if v is not None]
        if data is not None and optimizer is not None and len(parts) >= 3:
            step = sum(parts)
        return RankTimes(batch, data, None, optimizer, step, None, loader)
    f, b, c = got["forward"], got["backward"], got["comm"]
    if f is not None and b is not None and c is not None:
        t = RankTimes.of_phases(batch, data or 0.0, f, b, c, optimizer or 0.0)
        return replace(t, input_s=loader)
    compute = _num(record.get("compute_s")) or 0.0
    busy = compute + (data or 0.0) + (optimizer or 0.0)
    comm = max((step or busy) - busy, 0.0)
    return RankTimes(batch, data, compute, optimizer, busy + comm, comm, loader)


def intervals_from_records(ranks: Sequence[Sequence[Mapping[str, Any]]]) -> list[IntervalTimes]:
    """Intervals from per-rank metrics records (``metrics/rank<R>.jsonl``), aligned by step.

    An interval some rank timed no settled step of (``steps_measured`` 0) is
    ``measured=False`` and its ranks carry only their batch."""
    if not ranks or not ranks[0]:
        return []
    by_step = [{int(r["step"]): r for r in recs} for recs in ranks]
    out: list[IntervalTimes] = []
    prev = 0
    for rec0 in ranks[0]:
        step = int(rec0["step"])
        recs = [m.get(step) for m in by_step]
        if any(r is None for r in recs) or step <= prev:
            continue
        measured = all(r is not None and r.get("steps_measured") != 0 for r in recs)
        times = tuple(
            rank_times(r) if measured else RankTimes(int(r.get("batch") or 0))
            for r in recs
            if r is not None
        )
        wall = _num(rec0.get("interval_wall_s")) or 0.0
        if wall > 0:
            out.append(IntervalTimes(step, step - prev, wall, times, measured))
        prev = step
    return out


def solos_from_summary(summary: Mapping[str, Any] | None) -> list[Solo] | None:
    """The solo measurement a run's summary holds: ``solo`` (with phases) or, from runs
    written before it, ``standalone_samples_per_s`` at ``final_plan`` (rates only)."""
    if not summary:
        return None
    if summary.get("solo"):
        solos = [
            Solo(
                int(s["batch"]),
                float(s["samples_per_s"]),
                _num(s.get("data_s")),
                _num(s.get("compute_s")),
                _num(s.get("optimizer_s")),
            )
            for s in summary["solo"]
        ]
    else:
        rates = summary.get("standalone_samples_per_s") or []
        plan = summary.get("final_plan") or []
        if not rates or len(rates) != len(plan):
            return None
        solos = [Solo(int(b), float(r)) for b, r in zip(plan, rates, strict=True)]
    return solos if solos and all(s.samples_per_s > 0 and s.batch > 0 for s in solos) else None


# -- per-interval facts ---------------------------------------------------------------


def changed(intervals: Sequence[IntervalTimes]) -> list[bool]:
    """Whether each interval ran a plan other than the one before it: the first steps
    at a new batch size, and on the DataLoader path the workers restarting when their
    count moves. The run's first interval counts as one (its first steps at any size)."""
    return [k == 0 or iv.plan != intervals[k - 1].plan for k, iv in enumerate(intervals)]


def fit(iv: IntervalTimes) -> float:
    """The factor (≤ 1) that fits the interval's settled steps into its wall time.

    Every rank's settled steps are a subset of the interval's steps, so their mean
    times the step count is at most the wall time, but for noise: an interval with one
    or two settled steps, slower than the rest (its first steps at a new size), can
    say more. Its phases are then scaled down by this factor: the steps it measured
    stand for the interval in their proportions, and no time outside the steps is
    negative."""
    steps = [r.step_s for r in iv.ranks if r.step_s]
    top = max(steps, default=0.0)
    return min(1.0, iv.wall_per_step_s / top) if top > 0 else 1.0


def outside_s(iv: IntervalTimes) -> float | None:
    """Seconds per step of the interval outside any rank's settled steps (≥ 0): the
    boundary's exchange, steps left out as unsettled, pauses between steps. ``None``
    for an interval not measured."""
    if not iv.measured:
        return None
    top = max((r.step_s for r in iv.ranks if r.step_s), default=None)
    if top is None:
        return None
    return iv.wall_per_step_s - fit(iv) * top


def usual_boundary_s(intervals: Sequence[IntervalTimes], flags: Sequence[bool]) -> float:
    """The usual time outside the steps, per step, of an interval that keeps its plan
    (the median over such intervals): the boundary's own exchange and bookkeeping."""
    vals = [
        o
        for iv, ch in zip(intervals, flags, strict=True)
        if not ch and (o := outside_s(iv)) is not None
    ]
    return statistics.median(vals) if vals else 0.0


def steady_paces(
    intervals: Sequence[IntervalTimes], flags: Sequence[bool]
) -> dict[tuple[int, ...], float]:
    """Per plan, the median wall time per step of the measured intervals that kept it."""
    by_plan: dict[tuple[int, ...], list[float]] = {}
    for iv, ch in zip(intervals, flags, strict=True):
        if not ch and iv.measured:
            by_plan.setdefault(iv.plan, []).append(iv.wall_per_step_s)
    return {p: statistics.median(v) for p, v in by_plan.items()}
