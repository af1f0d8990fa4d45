"""What the gap breakdown reads: step phase times per interval and each rank alone.

``IntervalTimes`` holds one interval of the whole job (every rank's data,
compute, optimizer and step seconds per step, the interval's wall time);
``Solo`` one rank's measurement alone at its batch (the ideal's). Read from
the metrics records a run writes (``metrics/rank<R>.jsonl``: hetero's and the
plain-DDP baselines' share the field names) and from a run's summary; the
trainer builds them from its interval summaries. Standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankTimes:
    """One rank's seconds per step over one interval's settled steps; ``None``: not measured."""

    batch: int
    data_s: float | None = None
    compute_s: float | None = None
    optimizer_s: float | None = None
    step_s: float | None = None

    @property
    def busy_s(self) -> float | None:
        """Input wait + compute + optimizer; ``None`` without compute-only time (plain DDP).
        A phase not recorded counts as 0."""
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

    @property
    def step_s(self) -> float:
        """The measured step time: the ranks' mean (they are in lock step), else ``W``."""
        vals = [r.step_s for r in self.ranks if r.step_s]
        return statistics.fmean(vals) if vals else self.wall_per_step_s


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


def intervals_from_records(ranks: Sequence[Sequence[Mapping[str, Any]]]) -> list[IntervalTimes]:
    """Intervals from per-rank metrics records (``metrics/rank<R>.jsonl``), aligned by step.

    Reads ``batch``, ``compute_s``, ``step_s``, ``phases_s.data`` and
    ``phases_s.optimizer`` (plain DDP's records have no ``compute_s``). An interval
    some rank timed no settled step of (``steps_measured`` 0) is ``measured=False``.
    """
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
        times = []
        measured = True
        for r in recs:
            assert r is not None
            phases = r.get("phases_s") or {}
            if r.get("steps_measured") == 0:
                measured = False
            times.append(
                RankTimes(
                    batch=int(r.get("batch") or 0),
                    data_s=_num(phases.get("data", r.get("data_s"))),
                    compute_s=_num(r.get("compute_s")),
                    optimizer_s=_num(phases.get("optimizer", r.get("optimizer_s"))),
                    step_s=_num(r.get("step_s")),
                )
            )
        wall = _num(rec0.get("interval_wall_s")) or 0.0
        if wall > 0:
            out.append(IntervalTimes(step, step - prev, wall, tuple(times), measured))
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
