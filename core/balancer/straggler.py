"""Straggler detection over the interval history, and whether dropping a rank would pay.

A *straggler* is a rank whose per-sample compute time (``compute_s / batch``)
exceeds ``threshold`` times the median of the *other* ranks' for
``consecutive`` intervals in a row, ending at the newest. The median of the
others (not of all ranks) keeps the test meaningful at two ranks, where the
median of both would be their mean and a 1.5× slower rank only 1.2× "the median".

Per-sample time is a speed measure, not a balance measure: a well-balanced
plan gives the slow rank a small batch and equal step time, and it is still
flagged, because the question the event answers is "which device holds the
job back", and ``predict_exclusion`` then says whether running without it
would be faster. Requiring several intervals keeps one noisy interval from
raising an event; the fit shrinks a straggler's share whether or not it is
flagged.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.allreduce import all_reduce_s, backend_for
from hetero.core.balancer.model import StepModel, equal_time_plan, predict_step_s
from hetero.core.balancer.plan import Batches, Constraints
from hetero.core.balancer.stats import History, Interval, RankInterval
from hetero.core.errors import ConfigError, PlanError

#: Intervals a straggler's run is counted back over (the evidence says "at least" beyond).
LOOKBACK = 32


@dataclass(frozen=True)
class StragglerEvidence:
    """Why a rank is flagged: shown by the coordinator as an event and by the TUI.

    ``ratio`` is the rank's per-sample compute time over the median of the
    other ranks' in the newest interval; ``intervals`` how many consecutive
    intervals, ending at the newest, were above the threshold.
    """

    rank: int
    ratio: float
    intervals: int
    message: str


@dataclass(frozen=True)
class StragglerDetector:
    """Flags ranks slower than ``threshold``× the others' median for ``consecutive`` intervals."""

    threshold: float = 1.3
    consecutive: int = 2

    def __post_init__(self) -> None:
        if not self.threshold > 1.0:
            raise ConfigError(f"straggler.threshold must be > 1, got {self.threshold}")
        if self.consecutive < 1:
            raise ConfigError(f"straggler.consecutive must be >= 1, got {self.consecutive}")

    def detect(self, history: History) -> tuple[StragglerEvidence, ...]:
        """Evidence for every rank flagged at the newest interval, in rank order.

        A run is counted back at most ``LOOKBACK`` intervals (the event then
        says "at least"), so detection costs the same at any history length.
        """
        return self._flagged(history, {})

    def newly_flagged(self, history: History) -> tuple[StragglerEvidence, ...]:
        """``detect``'s evidence for the ranks that were not flagged one interval
        before (an event once per episode); each interval's ratios computed once."""
        ratios: dict[int, list[float | None]] = {}
        before = {e.rank for e in self._flagged(history[:-1], ratios)}
        return tuple(e for e in self._flagged(history, ratios) if e.rank not in before)

    def _flagged(
        self, history: History, ratios_by_id: dict[int, list[float | None]]
    ) -> tuple[StragglerEvidence, ...]:
        """``detect``, with the ratios of the intervals seen so far by ``id`` (the
        intervals outlive the call)."""

        def ratios_of(iv: Interval) -> list[float | None]:
            known = ratios_by_id.get(id(iv))
            if known is None:
                known = ratios_by_id[id(iv)] = per_sample_ratios(iv)
            return known

        if not history or len(history[-1]) < 2:
            return ()
        world = len(history[-1])
        newest = ratios_of(history[-1])
        runs = [0] * world
        open_runs = set(range(world))
        for iv in list(history[-LOOKBACK:])[::-1]:
            if len(iv) != world or not open_runs:
                break
            ratios = ratios_of(iv)
            for rank in list(open_runs):
                ratio = ratios[rank]
                if ratio is not None and ratio > self.threshold:
                    runs[rank] += 1
                else:
                    open_runs.discard(rank)
        out = []
        for rank in range(world):
            ratio = newest[rank]
            if runs[rank] >= self.consecutive and ratio is not None:
                at_least = "at least " if runs[rank] == LOOKBACK else ""
                out.append(
                    StragglerEvidence(
                        rank,
                        ratio,
                        runs[rank],
                        f"rank {rank} is a straggler: {ratio:.2f}x the median per-sample "
                        f"compute time of the other ranks for {at_least}{runs[rank]} "
                        f"intervals (threshold {self.threshold:g}x)",
                    )
                )
        return tuple(out)


def detect_stragglers(
    history: History, *, threshold: float = 1.3, consecutive: int = 2
) -> tuple[StragglerEvidence, ...]:
    """``StragglerDetector(threshold, consecutive).detect(history)``."""
    return StragglerDetector(threshold, consecutive).detect(history)


def new_stragglers(history: History) -> tuple[StragglerEvidence, ...]:
    """Ranks flagged at the newest interval of ``history`` that were not flagged one
    interval before (``StragglerDetector().newly_flagged``): the coordinator records
    an event for each, once per episode."""
    return StragglerDetector().newly_flagged(history)


def per_sample_ratios(interval: Interval) -> list[float | None]:
    """Each rank's per-sample compute time over the median of the other ranks'.

    ``None`` for a rank that ran no step, or when no other rank did.
    """
    per_sample = [
        _per_sample(ri) if ri.steps > 0 and ri.batch > 0 and ri.compute_s > 0 else None
        for ri in interval
    ]
    ordered = sorted(p for p in per_sample if p is not None)
    out: list[float | None] = []
    for mine in per_sample:
        if mine is None or len(ordered) < 2:
            out.append(None)
            continue
        out.append(mine / _median_without(ordered, bisect.bisect_left(ordered, mine)))
    return out


def _per_sample(ri: RankInterval) -> float | None:
    """Compute seconds per sample; None if that is not a positive finite number (a
    time so small that dividing it underflows to 0 says nothing either)."""
    value = ri.compute_s / ri.batch
    return value if 0 < value < math.inf else None


def _median_without(ordered: Sequence[float], skip: int) -> float:
    """Median of sorted ``ordered`` with the element at index ``skip`` left out."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < skip else k + 1]

    m = n // 2
    return at(m) if n % 2 else 0.5 * (at(m - 1) + at(m))


@dataclass(frozen=True)
class ExclusionForecast:
    """What running without ``rank`` would do to predicted throughput (same global batch).

    Throughputs are samples per second of the equal-time plan with and without
    the rank; ``gain`` is their ratio minus 1 (0.12 = 12% faster without it).
    ``plan_without`` has one entry per remaining rank, in rank order; it is
    empty when the other ranks cannot hold the global batch.
    """

    rank: int
    samples_per_s: float
    samples_per_s_without: float
    gain: float
    worthwhile: bool
    plan_without: Batches
    message: str
    #: Every rank left out (``(rank,)`` for one); ``rank`` is the first.
    excluded: tuple[int, ...] = ()


def predict_exclusion(
    models: Sequence[StepModel],
    constraints: Constraints,
    rank: int | Sequence[int],
    *,
    min_gain: float = 0.05,
    kinds: Sequence[str] | None = None,
) -> ExclusionForecast:
    """Whether excluding ``rank`` (one, or several together) raises predicted throughput
    by more than ``min_gain``.

    Both sides use the equal-time plan under ``models``; the global batch stays
    B, so the others take the rank's share. ``constraints.comm_s`` is the
    all-reduce measured with every rank; the smaller job's comes from
    ``allreduce.all_reduce_s`` (none for one rank, ring-scaled otherwise).
    ``kinds`` (device kind per rank, optional) lets the message say when the
    smaller job would change backend, where its all-reduce time is an upper
    bound. ``min_gain`` (default 5%) asks for a margin worth a restart.
    """
    world = constraints.world_size
    out = (rank,) if isinstance(rank, int) else tuple(sorted(set(rank)))
    for r in out:
        if not 0 <= r < world:
            raise PlanError(f"rank {r} is not in a world of {world}")
    if not out:
        raise PlanError("no rank to exclude")
    who = f"rank {out[0]}" if len(out) == 1 else f"ranks {', '.join(map(str, out))}"
    left = world - len(out)
    with_plan = equal_time_plan(models, constraints)
    with_tp = constraints.global_batch / predict_step_s(
        models, with_plan, comm_s=constraints.comm_s
    )
    rest = [m for r, m in enumerate(models) if r not in out]
    comm_without = all_reduce_s(constraints.comm_s, world, left)
    try:
        if not rest:
            raise PlanError("no rank would be left")
        caps = (
            tuple(c for r, c in enumerate(constraints.max_batch) if r not in out)
            if constraints.max_batch is not None
            else None
        )
        smaller = Constraints(
            constraints.global_batch, left, constraints.min_batch, caps, comm_without
        )
        without_plan = equal_time_plan(rest, smaller)
    except PlanError as exc:
        return ExclusionForecast(
            out[0], with_tp, 0.0, -1.0, False, (), f"{who} cannot be excluded: {exc}", out
        )
    without_tp = constraints.global_batch / predict_step_s(rest, without_plan, comm_s=comm_without)
    gain = without_tp / with_tp - 1.0
    worthwhile = gain > min_gain
    verdict = "would raise" if gain > 0 else "would lower" if gain < 0 else "would not change"
    comm = (
        "no all-reduce with one rank"
        if left == 1
        else f"all-reduce {constraints.comm_s * 1e3:.1f} -> {comm_without * 1e3:.1f} ms"
    )
    if kinds is not None and left > 1:
        rest_kinds = [k for r, k in enumerate(kinds) if r not in out]
        if backend_for(rest_kinds) != backend_for(kinds):
            comm += f", an upper bound: the job would run on {backend_for(rest_kinds)}"
    return ExclusionForecast(
        out[0],
        with_tp,
        without_tp,
        gain,
        worthwhile,
        without_plan,
        f"excluding {who} {verdict} predicted throughput by {abs(gain):.1%} "
        f"({with_tp:.0f} -> {without_tp:.0f} samples/s; {comm})",
        out,
    )
