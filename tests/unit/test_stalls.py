"""``coordinator.stalls``: a late pulse is a stall; the longest since the last ``take``,
including one that only ends at the ``take``."""

from __future__ import annotations

import pytest

from hetero.coordinator.stalls import PULSE_S, StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pulses_on_time_are_no_stall_and_a_late_one_is_its_lateness() -> None:
    clock = Clock()
    watch = StallWatch(clock)
    for _ in range(4):
        clock.now += PULSE_S
        watch.beat()
    assert watch.take() == 0.0
    clock.now += PULSE_S + 3.0
    watch.beat()
    clock.now += PULSE_S + 1.0
    watch.beat()
    assert watch.take() == pytest.approx(3.0), "the longest since the last take"
    assert watch.take() == 0.0, "taken: nothing since"


def test_a_stall_still_going_at_the_take_counts_up_to_now() -> None:
    clock = Clock()
    watch = StallWatch(clock)
    clock.now += PULSE_S + 30.0  # the sweep's timer fired before the pulse's
    assert watch.take() == pytest.approx(30.0)
