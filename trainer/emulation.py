"""Emulated heterogeneity for CPU runs: a rank made ``factor``× slower.

The slowdown adds *waiting* (not work) equal to ``(factor − 1)`` times the
rank's measured compute time of the current step, inside backward before the
last gradient bucket is handed to the all-reduce, so the rest of the job sees
it exactly as it would see a slower device. Waiting instead of burning CPU
keeps emulated ranks from stealing cores from the others on a small machine.
Every output of a run that used it says ``emulated``.
"""

from __future__ import annotations

import time

from hetero.core.errors import ConfigError
from hetero.core.slowdown import Slowdown, format_slowdowns
from hetero.core.slowdown import parse_slowdowns as _parse

__all__ = ["Slowdown", "emulate_wait", "format_slowdowns", "parse_slowdowns"]


def parse_slowdowns(spec: str | None) -> dict[int, Slowdown]:
    """``RANK:FACTOR[@START-END],...`` (``hetero.core.slowdown``), an error naming the option."""
    try:
        return _parse(spec)
    except ConfigError as exc:
        raise ConfigError(f"emulate_slowdown: {exc}") from None


def emulate_wait(factor: float, compute_s: float) -> float:
    """Sleep ``(factor − 1) · compute_s``; return the seconds actually waited."""
    if factor <= 1.0 or compute_s <= 0:
        return 0.0
    t0 = time.perf_counter()
    time.sleep((factor - 1.0) * compute_s)
    return time.perf_counter() - t0
