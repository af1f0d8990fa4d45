"""The whole run against its steady figure: what the plan changes cost.

The steady figure (the median interval of the run's latter half) leaves out what a
run pays once: the first steps at each new batch size, and on the DataLoader path
the loader's workers restarting when their count moves (seconds each). A run that
changed its plan often can reach half its steady rate over its whole length; this
account says how much of its time went to that. Standard library only.

Each interval that ran a new plan costs its wall time beyond its plan's steady
pace (the median wall time per step of the intervals that kept that plan); with no
such interval, its time outside its settled steps beyond the run's usual boundary
cost. Intervals that kept their plan and still ran beyond its median pace
(evaluation, checkpoints, a loader refilling at an epoch's start) are counted
apart. Both are measured times, each ≥ 0; neither is a plug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.steptimes import (
    IntervalTimes,
    changed,
    outside_s,
    steady_paces,
    usual_boundary_s,
)


@dataclass(frozen=True)
class WholeRun:
    """The run after its first interval (the whole-run figure's span), in seconds."""

    first_step: int
    last_step: int
    wall_s: float
    samples_per_s: float
    steady_samples_per_s: float
    plan_changes: int  # intervals that ran a new plan
    plan_change_s: float  # their time beyond their plans' steady pace
    slow_intervals: int  # intervals that kept their plan and ran beyond its median pace
    slow_s: float

    @property
    def plan_change_pct(self) -> float:
        """The share of the run's wall time the plan changes took, per cent."""
        return 100.0 * self.plan_change_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def slow_pct(self) -> float:
        return 100.0 * self.slow_s / self.wall_s if self.wall_s > 0 else 0.0


def whole_run(intervals: Sequence[IntervalTimes], steady_samples_per_s: float) -> WholeRun | None:
    """The account of ``intervals`` after the first (all of them if there is one)."""
    if not intervals:
        return None
    flags = changed(intervals)
    paces = steady_paces(intervals, flags)
    usual = usual_boundary_s(intervals, flags)
    span = range(1, len(intervals)) if len(intervals) > 1 else range(1)
    moved = slow = 0
    moved_s = slow_s = 0.0
    for k in span:
        iv = intervals[k]
        pace = paces.get(iv.plan)
        if flags[k]:
            moved += 1
            if pace is not None:
                moved_s += max(iv.wall_per_step_s - pace, 0.0) * iv.steps
            elif (o := outside_s(iv)) is not None:
                moved_s += max(o - usual, 0.0) * iv.steps
        elif pace is not None and iv.wall_per_step_s > pace:
            slow += 1
            slow_s += (iv.wall_per_step_s - pace) * iv.steps
    wall = sum(intervals[k].wall_s for k in span)
    samples = sum(sum(intervals[k].plan) * intervals[k].steps for k in span)
    first = intervals[span[0]]
    return WholeRun(
        first_step=first.end_step - first.steps,
        last_step=intervals[span[-1]].end_step,
        wall_s=wall,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        steady_samples_per_s=steady_samples_per_s,
        plan_changes=moved if len(intervals) > 1 else 0,
        plan_change_s=moved_s if len(intervals) > 1 else 0.0,
        slow_intervals=slow,
        slow_s=slow_s,
    )
