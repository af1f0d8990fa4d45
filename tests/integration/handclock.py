"""A clock tests move by hand, for ``Deps.clock`` (node health and telemetry buckets
depend on it)."""

from __future__ import annotations


class Clock:
    """Wall-clock seconds the test moves by hand (``now``)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
