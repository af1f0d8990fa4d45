"""What ranks measure and policies read: one record per rank per rebalance interval."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInterval:
    """One rank's measurements over one rebalance interval, all at one batch size.

    ``compute_s`` is the mean *compute-only* time per step: forward plus
    backward until the last gradient bucket is ready, without the wait for the
    all-reduce (which makes every rank's wall time equal the slowest rank's).
    """

    rank: int
    batch: int
    steps: int
    compute_s: float
    step_s: float = 0.0
    peak_memory_bytes: int | None = None

    @property
    def per_sample_s(self) -> float:
        return self.compute_s / self.batch if self.batch > 0 else float("inf")


#: One interval of the whole job: the ``RankInterval`` of every rank, in rank order.
Interval = Sequence[RankInterval]
#: Oldest first.
History = Sequence[Interval]


@dataclass(frozen=True)
class DeviceProfile:
    """Static description of the device a rank runs on (from the hardware profile)."""

    name: str
    compute_score: float
    memory_bytes: int | None = None
    emulated_slowdown: float = 1.0


def estimate_comm_s(history: History, window: int = 8) -> float:
    """Per-step time outside every rank's compute, seconds: a value for ``Constraints.comm_s``.

    Each interval's wall step time minus its slowest rank's compute time is
    what the whole job waited for after compute (exposed all-reduce, optimizer,
    data loading). The median over the newest ``window`` intervals that report
    ``step_s`` resists one slow interval; 0.0 when none reports it.
    """
    gaps = []
    for iv in list(history[-window:]):
        measured = [ri for ri in iv if ri.steps > 0 and ri.step_s > 0]
        if measured:
            step_s = max(ri.step_s for ri in measured)
            gaps.append(max(step_s - max(ri.compute_s for ri in measured), 0.0))
    if not gaps:
        return 0.0
    gaps.sort()
    m = len(gaps) // 2
    return gaps[m] if len(gaps) % 2 else 0.5 * (gaps[m - 1] + gaps[m])
