"""Emulated heterogeneity for CPU runs: a rank made ``factor``× slower.

The slowdown adds *waiting* (not work) equal to ``(factor − 1)`` times the
rank's measured compute time of the current step, inside backward before the
last gradient bucket is handed to the all-reduce, so the rest of the job sees
it exactly as it would see a slower device. Waiting instead of burning CPU
keeps emulated ranks from stealing cores from the others on a small machine.
Every output of a run that used it says ``emulated``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from hetero.core.errors import ConfigError

_SPEC = re.compile(r"^\s*(\d+)\s*:\s*([0-9]*\.?[0-9]+)\s*(?:@\s*(\d+)?\s*-\s*(\d+)?)?\s*$")


@dataclass(frozen=True)
class Slowdown:
    """``factor``× slower from global step ``start`` (inclusive) to ``end`` (exclusive)."""

    factor: float
    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        if not 1.0 <= self.factor <= 1000.0:
            raise ConfigError(f"slowdown factor must be in [1, 1000], got {self.factor}")
        if self.end is not None and self.end <= self.start:
            raise ConfigError(f"slowdown window {self.start}-{self.end} is empty")

    def factor_at(self, step: int) -> float:
        active = step >= self.start and (self.end is None or step < self.end)
        return self.factor if active else 1.0

    def describe(self) -> str:
        window = "" if (self.start == 0 and self.end is None) else f"@{self.start}-{self.end or ''}"
        return f"{self.factor:g}x{window}"


def parse_slowdowns(spec: str | None) -> dict[int, Slowdown]:
    """Parse ``RANK:FACTOR[@START-END],...`` (e.g. ``1:2,2:3@100-200``)."""
    if not spec:
        return {}
    out: dict[int, Slowdown] = {}
    for part in spec.split(","):
        m = _SPEC.match(part)
        if not m:
            raise ConfigError(
                f"--emulate-slowdown: cannot parse {part.strip()!r}; "
                "expected RANK:FACTOR[@START-END]"
            )
        rank = int(m.group(1))
        if rank in out:
            raise ConfigError(f"--emulate-slowdown: rank {rank} given twice")
        start = int(m.group(3)) if m.group(3) else 0
        end = int(m.group(4)) if m.group(4) else None
        out[rank] = Slowdown(float(m.group(2)), start, end)
    return out


def format_slowdowns(slowdowns: Mapping[int, Slowdown]) -> str:
    return ",".join(f"{r}:{s.describe()}" for r, s in sorted(slowdowns.items()))


def emulate_wait(factor: float, compute_s: float) -> float:
    """Sleep ``(factor − 1) · compute_s``; return the seconds actually waited."""
    if factor <= 1.0 or compute_s <= 0:
        return 0.0
    t0 = time.perf_counter()
    time.sleep((factor - 1.0) * compute_s)
    return time.perf_counter() - t0
