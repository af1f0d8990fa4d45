"""Every NVML call goes through :meth:`Nvml.call`, which answers ``None`` ("n/a") on failure.

A machine without an NVIDIA driver, a driver without NVML, or a GPU that does
not support one field must degrade, not crash: the first failure of each kind
is logged once (at INFO for "not supported", WARNING otherwise) and every later
one is silent. ``nvidia-ml-py`` is imported lazily so the agent runs where it is
missing too.

It lives in ``core`` because two packages read GPUs through it: the agent (its
profile and telemetry) and each training rank (``hetero.trainer.gpustats``), and
neither may import the other. Importing it loads only the standard library.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("hetero.core.nvml")

T = TypeVar("T")

#: NVML clock-event (throttle) reason bits -> names used in ``ThrottleReasons``.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_names(mask: int) -> tuple[str, ...]:
    """Names of the reason bits set in ``mask`` (``()`` = not throttled)."""
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU; ``None`` = n/a. Units in the names."""

    index: int
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: tuple[str, ...] | None = None
    #: Pids of every process holding a context on the GPU (compute and graphics).
    pids: tuple[int, ...] | None = None


class Nvml:
    """A lazily initialised NVML session. Thread-safe; never raises from ``call``."""

    def __init__(self, module: Any | None = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._started = False
        self._available = False
        self._logged: set[str] = set()

    def _log_once(self, key: str, message: str, level: int = logging.WARNING) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message)

    def _start(self) -> bool:
        with self._lock:
            if self._started:
                return self._available
            self._started = True
            try:
                if self._module is None:
                    import pynvml

                    self._module = pynvml
                self._module.nvmlInit()
                self._available = True
            except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
                # INFO: a CPU-only node is a supported setup, not a fault.
                self._log_once(
                    "init", f"NVML not available ({exc}); GPU telemetry is n/a", logging.INFO
                )
            return self._available

    @property
    def available(self) -> bool:
        return self._start()

    def call(self, name: str, fn: Callable[[Any], T]) -> T | None:
        """``fn(pynvml)``, or ``None`` if NVML is missing or the call fails.

        ``name`` keys the log-once: one message per kind of failing call.
        """
        if not self._start():
            return None
        try:
            return fn(self._module)
        except Exception as exc:
            unsupported = "Not Supported" in str(exc)
            level = logging.INFO if unsupported else logging.WARNING
            self._log_once(name, f"NVML {name}: {exc}; reported as n/a", level)
            return None

    def device_count(self) -> int:
        return self.call("device_count", lambda m: int(m.nvmlDeviceGetCount())) or 0

    def device_name(self, index: int) -> str | None:
        def name(m: Any) -> str:
            raw = m.nvmlDeviceGetName(m.nvmlDeviceGetHandleByIndex(index))
            return raw.decode() if isinstance(raw, bytes) else str(raw)

        return self.call("name", name)

    def memory_total_bytes(self, index: int) -> int | None:
        return self.call(
            "memory",
            lambda m: int(m.nvmlDeviceGetMemoryInfo(m.nvmlDeviceGetHandleByIndex(index)).total),
        )

    def running_pids(self, index: int) -> tuple[int, ...] | None:
        """Pids with a context on GPU ``index``, sorted; ``None`` = n/a.

        Inside a container without the host's pid namespace NVML reports host
        pids (or none at all), so callers compare them with their own pids as a
        hint, never as proof.
        """
        return self.call("processes", lambda m: _pids(m, m.nvmlDeviceGetHandleByIndex(index)))

    def memory_bus_width_bits(self, index: int) -> int | None:
        return self.call(
            "bus_width",
            lambda m: int(m.nvmlDeviceGetMemoryBusWidth(m.nvmlDeviceGetHandleByIndex(index))),
        )

    def max_clock_mhz(self, index: int, clock: str) -> float | None:
        """The highest ``clock`` ("sm" or "mem") the GPU can run at, in MHz."""

        def read(m: Any) -> float:
            which = m.NVML_CLOCK_SM if clock == "sm" else m.NVML_CLOCK_MEM
            return float(m.nvmlDeviceGetMaxClockInfo(m.nvmlDeviceGetHandleByIndex(index), which))

        return self.call(f"max_{clock}_clock", read)

    def max_pcie_link(self, index: int) -> tuple[int, int] | None:
        """(generation, lanes) of the fastest PCIe link the GPU and its slot support."""

        def read(m: Any) -> tuple[int, int]:
            handle = m.nvmlDeviceGetHandleByIndex(index)
            gen = int(m.nvmlDeviceGetMaxPcieLinkGeneration(handle))
            return gen, int(m.nvmlDeviceGetMaxPcieLinkWidth(handle))

        return self.call("pcie", read)

    def sample(self, index: int) -> GpuSample:
        """Every telemetry field of GPU ``index``; each field n/a on its own."""
        handle = self.call("handle", lambda m: m.nvmlDeviceGetHandleByIndex(index))
        if handle is None:
            return GpuSample(index)
        memory = self.call("memory", lambda m: m.nvmlDeviceGetMemoryInfo(handle))
        util = self.call("utilization", lambda m: m.nvmlDeviceGetUtilizationRates(handle).gpu)
        temp = self.call(
            "temperature", lambda m: m.nvmlDeviceGetTemperature(handle, m.NVML_TEMPERATURE_GPU)
        )
        power_mw = self.call("power", lambda m: m.nvmlDeviceGetPowerUsage(handle))
        clock = self.call("sm_clock", lambda m: m.nvmlDeviceGetClockInfo(handle, m.NVML_CLOCK_SM))
        reasons = self.call("throttle", lambda m: _throttle_mask(m, handle))
        return GpuSample(
            index=index,
            utilization_percent=float(util) if util is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            throttle_reasons=throttle_names(reasons) if reasons is not None else None,
            pids=self.call("processes", lambda m: _pids(m, handle)),
        )


def _pids(m: Any, handle: Any) -> tuple[int, ...]:
    found: set[int] = set()
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        if hasattr(m, name):
            found.update(int(p.pid) for p in getattr(m, name)(handle))
    return tuple(sorted(found))


def _throttle_mask(m: Any, handle: Any) -> int:
    # Renamed "clocks event reasons" in newer drivers; the old name is deprecated.
    if hasattr(m, "nvmlDeviceGetCurrentClocksEventReasons"):
        return int(m.nvmlDeviceGetCurrentClocksEventReasons(handle))
    return int(m.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
