"""Emulated slowdowns as written: ``RANK:FACTOR[@START-END],...`` (``1:2,2:3@100-200``).

The form ``hetero-train --emulate-slowdown`` and ``ht.init(emulate_slowdown=...)``
take, parsed once here so that the catalogue can check it where the option is
given and the trainer can apply it (``hetero.trainer.emulation``). Every output
of a run that used a slowdown says *emulated*.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hetero.core.errors import ConfigError

#: A factor above this is a typo, not a demo (job.yaml's per-rank factors share it).
MAX_FACTOR = 100.0

_SPEC = re.compile(r"^\s*(\d+)\s*:\s*([0-9]*\.?[0-9]+)\s*(?:@\s*(\d+)?\s*-\s*(\d+)?)?\s*$")


@dataclass(frozen=True)
class Slowdown:
    """``factor``× slower from global step ``start`` (inclusive) to ``end`` (exclusive)."""

    factor: float
    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        if not 1.0 <= self.factor <= MAX_FACTOR:
            raise ConfigError(f"slowdown factor must be in [1, {MAX_FACTOR:g}], got {self.factor}")
        if self.end is not None and self.end <= self.start:
            raise ConfigError(f"slowdown window {self.start}-{self.end} is empty")

    def factor_at(self, step: int) -> float:
        active = step >= self.start and (self.end is None or step < self.end)
        return self.factor if active else 1.0

    def describe(self) -> str:
        window = "" if (self.start == 0 and self.end is None) else f"@{self.start}-{self.end or ''}"
        return f"{self.factor:g}x{window}"


def parse_slowdowns(spec: str | None) -> dict[int, Slowdown]:
    """Parse ``RANK:FACTOR[@START-END],...``; a bad part is a ``ConfigError`` that quotes it
    (the caller names the option in its own spelling)."""
    if not spec:
        return {}
    out: dict[int, Slowdown] = {}
    for part in spec.split(","):
        m = _SPEC.match(part)
        if not m:
            raise ConfigError(f"cannot parse {part.strip()!r}; expected RANK:FACTOR[@START-END]")
        rank = int(m.group(1))
        if rank in out:
            raise ConfigError(f"rank {rank} given twice")
        start = int(m.group(3)) if m.group(3) else 0
        end = int(m.group(4)) if m.group(4) else None
        out[rank] = Slowdown(float(m.group(2)), start, end)
    return out


def format_slowdowns(slowdowns: Mapping[int, Slowdown]) -> str:
    return ",".join(f"{r}:{s.describe()}" for r, s in sorted(slowdowns.items()))
