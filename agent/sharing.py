"""How much of a GPU foreign processes take, and what that leaves for a new job.

The rule (used for the compute score an initial plan is made from):

- A GPU is *shared* when, over the last ``window_s`` seconds of telemetry
  (60 s by default), every sample listed a process on it that is neither this
  agent nor one of its ranks, and the window is covered (samples span at
  least ``window_s``).
- Its *foreign utilization* u is the mean NVML utilization over those samples,
  counting only samples taken while none of our ranks ran on it (with our own
  work on it the reading is mixed; the last estimate then stands).
- The score is divided by ``1 + u/100``: under time-slicing a new process gets
  about ``1/(1 + u)`` of a GPU that a neighbour keeps busy a fraction u of the
  time (half of it next to a neighbour that never idles).

The profile itself starts the estimate: a GPU with foreign processes when it
is profiled registers the utilization NVML reported just before (and its idle
speed from an idle sibling, or its measured speed times ``1 + u``, so the
contention is not counted twice). Telemetry then confirms or clears it: a
neighbour that leaves restores the score at the next sample without it. A
brief neighbour (shorter than the window) that arrives later changes nothing:
the balancer corrects the plan from measured step times once the job runs. The agent
re-registers with the new score when the factor moves by more than
``REREGISTER_CHANGE``, so placements made later start from it.

Pure: samples in, numbers out; the telemetry thread feeds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

#: Relative change of the sharing factor that is worth a new registration.
REREGISTER_CHANGE = 0.10


def sharing_factor(foreign_utilization_percent: float | None) -> float:
    """The fraction of a GPU's speed a new job gets next to foreign work (1.0 = alone)."""
    if not foreign_utilization_percent or foreign_utilization_percent <= 0:
        return 1.0
    return 1.0 / (1.0 + min(foreign_utilization_percent, 100.0) / 100.0)


@dataclass(frozen=True)
class _Sample:
    time_s: float
    foreign: bool
    ours: bool
    utilization_percent: float | None


class ForeignLoad:
    """Sustained foreign utilization of each GPU, from a sliding window of samples."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._samples: dict[int, deque[_Sample]] = {}
        self._estimate: dict[int, float] = {}

    def observe(
        self,
        index: int,
        time_s: float,
        utilization_percent: float | None,
        pids: Iterable[int] | None,
        own_pids: set[int],
    ) -> None:
        """One telemetry sample of GPU ``index``. ``pids=None`` (NVML cannot list
        processes) counts as "no foreign process": sharing is never guessed."""
        listed = set(pids or ())
        sample = _Sample(
            time_s, bool(listed - own_pids), bool(listed & own_pids), utilization_percent
        )
        window = self._samples.setdefault(index, deque())
        window.append(sample)
        # Keep the newest sample at or before the window's start: it shows what held
        # there, however far apart the samples are.
        while len(window) >= 2 and window[1].time_s <= time_s - self.window_s:
            window.popleft()
        self._update(index, window)

    def _update(self, index: int, window: deque[_Sample]) -> None:
        covered = window[-1].time_s - window[0].time_s >= self.window_s * 0.95
        if not all(s.foreign for s in window):
            self._estimate[index] = 0.0  # a sample without a neighbour: not shared
            return
        alone = [s.utilization_percent for s in window if not s.ours]
        readings = [u for u in alone if u is not None]
        if covered and readings and len(readings) == len(alone):
            self._estimate[index] = sum(readings) / len(readings)

    def utilization_percent(self, index: int) -> float | None:
        """Sustained foreign utilization of GPU ``index``: 0.0 = not shared (a sample in
        the window had no foreign process), ``None`` = no verdict yet (foreign processes
        in every sample, but not for a whole window)."""
        return self._estimate.get(index)


def worth_reregistering(registered: float | None, now: float | None) -> bool:
    """Whether the sharing factor moved enough since the last registration (``now``
    ``None``: no verdict yet, keep the registered one)."""
    if now is None:
        return False
    before, after = sharing_factor(registered), sharing_factor(now)
    return abs(after - before) / before > REREGISTER_CHANGE
