"""This rank's GPU utilisation and memory over each rebalance interval, from NVML.

A daemon thread reads the rank's GPU every ``period_s`` through
:class:`hetero.core.nvml.Nvml` (the one helper for NVML calls: a missing
library, driver or field is n/a and logged once) and adds each reading to the
interval's sums. At a boundary the rank takes the means and the next interval
starts (:meth:`GpuSampler.take`: two sums read under a lock). Nothing runs on the
step path. Where there is no GPU, no NVML, or NVML does not know the rank's GPU,
there is no thread and both figures are ``None`` (``null`` in the metrics file).

Units, both per cent (0-100): utilisation is NVML's ``utilization.gpu``, the share
of the driver's sample period (1/6 s to 1 s) in which a kernel ran, averaged over
the interval's readings; memory is the device memory in use over its total
(``nvidia-smi``'s memory %), averaged the same way. Memory in use counts every
process on the GPU, not only this rank's tensors (``peak_memory_bytes`` is those).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hetero.core.nvml import Nvml

log = logging.getLogger("hetero.trainer.gpustats")

#: Seconds between readings: a boundary every few seconds sees several, and two NVML
#: queries (tens of microseconds) twice a second cost the rank nothing measurable.
PERIOD_S = 0.5


@dataclass(frozen=True)
class GpuReading:
    """GPU utilisation and memory in use, per cent; ``None`` = n/a."""

    util_percent: float | None = None
    memory_percent: float | None = None


NOT_AVAILABLE = GpuReading()


class IntervalMeans:
    """Means of the readings added since the last :meth:`take`, each field on its own.

    An interval shorter than the sampling period may get no reading; it then takes
    the newest reading before it (itself a mean over NVML's sample period), so a
    GPU rank's record is ``null`` only where NVML cannot say."""

    def __init__(self) -> None:
        self._sums = [0.0, 0.0]
        self._counts = [0, 0]
        self._last = NOT_AVAILABLE

    def add(self, reading: GpuReading) -> None:
        for i, value in enumerate((reading.util_percent, reading.memory_percent)):
            if value is not None:
                self._sums[i] += value
                self._counts[i] += 1
        if reading != NOT_AVAILABLE:
            self._last = reading

    def take(self) -> GpuReading:
        """The interval's means; the next interval starts empty."""
        means = [s / n if n else None for s, n in zip(self._sums, self._counts, strict=True)]
        self._sums, self._counts = [0.0, 0.0], [0, 0]
        if means == [None, None]:
            return self._last
        return GpuReading(means[0], means[1])


class GpuSampler:
    """Reads ``read()`` every ``period_s`` on a daemon thread; :meth:`take` at each boundary."""

    def __init__(self, read: Callable[[], GpuReading], period_s: float = PERIOD_S) -> None:
        self._read = read
        self._period_s = period_s
        self._means = IntervalMeans()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-stats", daemon=True)

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            reading = self._read()
            with self._lock:
                self._means.add(reading)
            if self._stop.wait(self._period_s):
                return

    def take(self) -> GpuReading:
        with self._lock:
            return self._means.take()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)


def nvml_reader(nvml: Nvml, handle: Any) -> Callable[[], GpuReading]:
    """One reading of the GPU behind ``handle``; a field NVML cannot give is ``None``."""

    def read() -> GpuReading:
        util = nvml.call(
            "utilization", lambda m: float(m.nvmlDeviceGetUtilizationRates(handle).gpu)
        )
        memory = nvml.call("memory", lambda m: m.nvmlDeviceGetMemoryInfo(handle))
        percent = (
            100.0 * memory.used / memory.total if memory is not None and memory.total else None
        )
        return GpuReading(util, percent)

    return read


def open_sampler(
    device: torch.device, nvml: Nvml | None = None, period_s: float = PERIOD_S
) -> GpuSampler | None:
    """A started sampler of ``device``'s GPU, or None (CPU rank, no NVML, GPU unknown).

    The GPU is found by its UUID, not its CUDA index: CUDA numbers the devices a
    process sees (``CUDA_VISIBLE_DEVICES``, fastest first), NVML all of them in PCI
    order, so the indexes need not agree."""
    if device.type != "cuda":
        return None
    nvml = nvml or Nvml()
    if not nvml.available:
        return None
    uuid = _uuid(device)
    if uuid is None:
        log.info("the UUID of %s is unknown; GPU utilisation and memory are n/a", device)
        return None
    handle = nvml.call("handle", lambda m: m.nvmlDeviceGetHandleByUUID(uuid))
    if handle is None:
        return None
    return GpuSampler(nvml_reader(nvml, handle), period_s).start()


def _uuid(device: torch.device) -> str | None:
    """NVML's name of ``device``: ``GPU-`` and the UUID torch reports (None if it cannot)."""
    try:
        raw = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError, AssertionError):
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"
