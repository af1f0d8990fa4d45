"""GPU utilization sampled through NVML while a run trains; "n/a" without NVML.

Every NVML call goes through :meth:`GpuMonitor._nvml`, which turns any failure
(no ``pynvml``, no driver, a field the device does not support) into ``None``
and logs it once, so a missing or odd GPU degrades the figure, never the run.
Samples are ``(time.time() seconds, [utilization % per GPU or None])``, taken
every ``period_s`` on a daemon thread; indices are NVML's (PCI bus order, which
the harness also gives CUDA through ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

log = logging.getLogger("hetero.bench")

Sample = tuple[float, list[float | None]]


class GpuMonitor:
    """Background NVML sampler of ``utilization.gpu`` for the first ``count`` GPUs."""

    def __init__(self, count: int, period_s: float = 0.2) -> None:
        self.count = count
        self.period_s = period_s
        self.samples: list[Sample] = []
        self.names: list[str] = []
        self._warned: set[str] = set()
        self._pynvml: Any = None
        self._handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = count > 0 and self._init()

    def _nvml(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # NVML raises its own error types, or ImportError-likes
            if what not in self._warned:
                self._warned.add(what)
                log.warning("NVML %s unavailable (%s); reporting n/a", what, exc)
            return None

    def _init(self) -> bool:
        def load() -> Any:
            import pynvml

            pynvml.nvmlInit()
            return pynvml

        self._pynvml = self._nvml("init", load)
        if self._pynvml is None:
            return False
        nv = self._pynvml
        n = self._nvml("device count", nv.nvmlDeviceGetCount) or 0
        for i in range(min(self.count, n)):
            h = self._nvml("device handle", partial(nv.nvmlDeviceGetHandleByIndex, i))
            if h is None:
                return False
            self._handles.append(h)
            name = self._nvml("device name", partial(nv.nvmlDeviceGetName, h))
            self.names.append(name.decode() if isinstance(name, bytes) else str(name or "GPU"))
        return bool(self._handles)

    def sample(self) -> Sample:
        nv = self._pynvml
        util: list[float | None] = []
        for h in self._handles:
            rates = self._nvml("utilization", partial(nv.nvmlDeviceGetUtilizationRates, h))
            util.append(float(rates.gpu) if rates is not None else None)
        return time.time(), util

    def start(self) -> None:
        if not self.available or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(self.sample())

    def stop(self) -> list[Sample]:
        """Stop sampling; return (and forget) the samples taken since ``start``."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            self._thread = None
        out, self.samples = self.samples, []
        return out

    def close(self) -> None:
        self.stop()
        if self._pynvml is not None and self.available:
            self._nvml("shutdown", self._pynvml.nvmlShutdown)


def write_samples(path: Path, samples: list[Sample]) -> None:
    with path.open("w") as fh:
        for t, util in samples:
            fh.write(json.dumps({"time_s": t, "util_pct": util}) + "\n")


def read_samples(path: Path) -> list[Sample]:
    if not path.exists():
        return []
    out: list[Sample] = []
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out.append((float(r["time_s"]), list(r["util_pct"])))
    return out
