"""What ranks measure and policies read: one record per rank per rebalance interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: The variance of a median over a mean's is π/2: its standard error is this √ times.
MEDIAN_SE = 1.2533


@dataclass(frozen=True)
class RankInterval:
    """One rank's measurements over one rebalance interval, all at one batch size.

    Times are seconds per step over the interval's settled steps.
    ``compute_s`` is the *compute-only* time: forward plus backward until the
    last gradient bucket is ready, without the wait for the all-reduce (which
    makes every rank's wall time equal the slowest rank's). ``data_s`` is the
    exposed wait for the step's input and ``optimizer_s`` the optimizer step;
    both run on each rank between two gradient synchronisations, so they are
    on the critical path as much as compute (``busy_s``). ``None`` = not
    measured (an older trainer): busy time is then compute time.

    ``switch_s`` is the extra time, in seconds in all, that the rank's first
    steps at a new batch size took over its settled steps (allocator growth,
    kernel selection for new shapes): what a plan change cost this rank. In a
    process's first interval it is what its first batch size cost its warm-up
    steps (compute and optimizer only: the loader's first batches wait for its
    workers to start, once): the same cost, measured before any plan change.
    ``None`` when the rank's batch did not change in this interval.

    ``busy_cv`` is the relative spread (robust, one standard deviation) of the
    settled steps' busy times within the interval: from the first interval on,
    it says how well the interval's median is known (``noise_floor``).

    ``input_s`` is the seconds per step this rank's background input pipeline
    (its DataLoader workers) needs to make one batch of ``batch`` samples:
    the workers' median seconds per sample, times ``batch``, over the number
    of workers, measured in the workers. A rank cannot step faster than that,
    whatever its device does, and ``data_s`` is only the part of it that was
    exposed. ``None`` when batches are made on the training thread (no workers,
    or a dataset already on the device), whose time is then in ``data_s``.
    ``input_cv`` is the relative spread (robust, one standard deviation) of the
    workers' seconds per sample over the same batches: a loader that jitters
    makes one interval's rate a rough estimate (``input_noise_floor``).
    """

    rank: int
    batch: int
    steps: int
    compute_s: float
    step_s: float = 0.0
    peak_memory_bytes: int | None = None
    data_s: float | None = None
    optimizer_s: float | None = None
    switch_s: float | None = None
    busy_cv: float | None = None
    input_s: float | None = None
    input_cv: float | None = None

    @property
    def noise_floor(self) -> float | None:
        """Relative standard error of the interval's median busy time from the spread of
        its steps (``MEDIAN_SE·cv/√steps``, a median's); None where not measured. Intervals
        vary at least this much; on a shared host, with its swings of load, more."""
        if self.busy_cv is None or self.steps < 1:
            return None
        return MEDIAN_SE * self.busy_cv / math.sqrt(self.steps)

    @property
    def input_noise_floor(self) -> float | None:
        """Relative standard error of the interval's input rate (a median over its
        batches) from the spread of those batches, as ``noise_floor`` is of its busy
        time; None where not measured."""
        if self.input_cv is None or self.steps < 1:
            return None
        return MEDIAN_SE * self.input_cv / math.sqrt(self.steps)

    @property
    def busy_s(self) -> float:
        """Seconds per step the rank is busy between two synchronisations: exposed input
        wait + compute + optimizer (compute alone where the phases were not measured)."""
        return self.compute_s + (self.data_s or 0.0) + (self.optimizer_s or 0.0)

    @property
    def work_s(self) -> float:
        """Seconds per step of the rank's own work, the part a batch size sets on the
        training thread: compute + optimizer, and the input wait where batches are made
        on that thread (no background pipeline: ``input_s`` is None). Where a pipeline
        makes them, the wait it exposes is its own rate showing (``input_s`` models it)
        or its jitter, not the rank's work."""
        data = (self.data_s or 0.0) if self.input_s is None else 0.0
        return self.compute_s + data + (self.optimizer_s or 0.0)

    @property
    def input_per_sample_s(self) -> float | None:
        """Seconds per sample of the rank's background input pipeline (``input_s`` over
        the batch); None without one."""
        if self.input_s is None or self.batch <= 0 or not math.isfinite(self.input_s):
            return None
        return max(self.input_s, 0.0) / self.batch

    @property
    def per_sample_s(self) -> float:
        """Compute-only seconds per sample (a speed measure: stragglers, the TUI)."""
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
    """Per-step time outside every rank's busy time, seconds: a value for ``Constraints.comm_s``.

    Each interval's wall step time minus its slowest rank's busy time (input
    wait + compute + optimizer) is what the whole job waited for beyond any
    rank's own work: the exposed all-reduce. The median over the newest
    ``window`` intervals that report ``step_s`` resists one slow interval; 0.0
    when none reports it.
    """
    gaps = []
    for iv in list(history[-window:]):
        measured = [ri for ri in iv if ri.steps > 0 and ri.step_s > 0]
        if measured:
            step_s = max(ri.step_s for ri in measured)
            gaps.append(max(step_s - max(ri.busy_s for ri in measured), 0.0))
    if not gaps:
        return 0.0
    gaps.sort()
    m = len(gaps) // 2
    return gaps[m] if len(gaps) % 2 else 0.5 * (gaps[m - 1] + gaps[m])
