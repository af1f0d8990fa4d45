"""One GPU's profile: timed on that GPU, checked against its own limits, re-measured once.

Every figure is timed with CUDA events recorded on the measured device's
current stream inside ``torch.cuda.device(index)``, and waited for with that
device's event (``Event.synchronize``), never with a bare
``torch.cuda.synchronize()``: that waits for the *current* device, device 0,
while the work runs on device ``index``, so the clock stops before the work
ends (an H100 then "reaches" 10 TB/s of HBM and 6 TB/s over PCIe).

A figure above the device's peak (``agent.devicelimits``) is measured once
more; still implausible, it is kept but marked *suspect*, logged as a warning,
shown by ``hetero-coord nodes`` and left out of the compute score. Processes
other than this one holding a context on the GPU when its profile starts are
recorded (``foreign_pids``): their work slows the figures and the profile says so.

The CUDA calls go through a ``CudaLayer`` so the logic is tested with a fake one.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hetero.agent.devicelimits import DeviceLimits, implausible, limits_from_nvml
from hetero.core.nvml import Nvml

log = logging.getLogger("hetero.agent.profile")


@dataclass(frozen=True)
class GpuFigures:
    """One measurement of one GPU: TFLOP/s and bytes/s."""

    matmul_tflops: float
    memory_bandwidth_bytes_per_s: float
    host_to_device_bytes_per_s: float
    device_to_host_bytes_per_s: float

    def values(self) -> dict[str, float | None]:
        return {
            "matmul_tflops": self.matmul_tflops,
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "host_to_device_bytes_per_s": self.host_to_device_bytes_per_s,
            "device_to_host_bytes_per_s": self.device_to_host_bytes_per_s,
        }


@dataclass(frozen=True)
class GpuProps:
    name: str
    memory_bytes: int
    sm_count: int | None
    capability: tuple[int, int] | None


class CudaLayer(Protocol):
    """What the profile needs of CUDA; :class:`TorchCuda` in production."""

    def device_count(self) -> int: ...

    def props(self, index: int) -> GpuProps: ...

    def measure(self, index: int, quick: bool) -> GpuFigures: ...

    def release(self, index: int) -> None: ...


@dataclass(frozen=True)
class GpuProfile:
    """A checked measurement. ``suspect`` names the figures that failed the check
    twice (with the reasons in ``warnings``); ``foreign_pids`` the other processes
    on the GPU when it was profiled."""

    index: int
    props: GpuProps
    figures: GpuFigures
    limits: DeviceLimits
    suspect: tuple[str, ...] = ()
    foreign_pids: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    #: NVML utilization just before the measurement, while only the foreign processes
    #: ran (percent); ``None`` when there were none.
    foreign_utilization_percent: float | None = None


def foreign_pids(nvml: Nvml, index: int, own: set[int]) -> tuple[int, ...]:
    """Pids on GPU ``index`` other than ``own``; () when NVML cannot list them."""
    return tuple(p for p in nvml.running_pids(index) or () if p not in own)


def profile_gpu(nvml: Nvml, cuda: CudaLayer, index: int, quick: bool) -> GpuProfile:
    """Measure GPU ``index``, re-measuring once if a figure exceeds its limits.

    The process list is read before this process touches the GPU, so a pid
    namespace that hides our own pid from NVML cannot make us our own neighbour.
    """
    foreign = foreign_pids(nvml, index, {os.getpid()})
    busy = nvml.sample(index).utilization_percent if foreign else None
    props = cuda.props(index)
    limits = limits_from_nvml(nvml, index, sm_count=props.sm_count, capability=props.capability)
    figures = cuda.measure(index, quick)
    bad = implausible(figures.values(), limits)
    if bad:
        log.info("cuda:%d: %s; measuring again", index, "; ".join(bad.values()))
        again = cuda.measure(index, quick)
        still = implausible(again.values(), limits)
        # Suspect only where both measurements failed; where one passed, keep that one.
        first_passed = {k: getattr(figures, k) for k in still if k not in bad}
        figures = replace(again, **first_passed)
        bad = {k: why for k, why in still.items() if k in bad}
    warnings = tuple(f"cuda:{index} {props.name}: suspect {why}" for why in bad.values())
    for w in warnings:
        log.warning("%s (measured twice; left out of the compute score)", w)
    if foreign:
        log.warning(
            "cuda:%d %s: profiled while other processes used it (pids %s): its figures "
            "are lower than the idle device's",
            index,
            props.name,
            ", ".join(map(str, foreign)),
        )
    return GpuProfile(index, props, figures, limits, tuple(bad), foreign, warnings, busy)


class TorchCuda:
    """The real CUDA layer: torch on the measured device, timed with its own events."""

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def props(self, index: int) -> GpuProps:
        import torch

        p = torch.cuda.get_device_properties(index)
        return GpuProps(
            name=p.name,
            memory_bytes=int(p.total_memory),
            sm_count=int(p.multi_processor_count),
            capability=(int(p.major), int(p.minor)),
        )

    def measure(self, index: int, quick: bool) -> GpuFigures:
        import torch

        with torch.cuda.device(index):  # events, streams and the default device: this GPU
            dev = torch.device("cuda", index)
            n = 2048 if quick else 8192
            a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            tflops = 2 * n**3 / _best_event_s(lambda: a @ b, 3) / 1e12
            size = (64 if quick else 512) * 1024 * 1024
            src = torch.empty(size, dtype=torch.uint8, device=dev)
            dst = torch.empty_like(src)
            # A device-to-device copy reads and writes every byte.
            bandwidth = 2 * size / _best_event_s(lambda: dst.copy_(src), 3)
            host = torch.empty(size, dtype=torch.uint8).pin_memory()
            h2d = size / _best_event_s(lambda: src.copy_(host, non_blocking=True), 3)
            d2h = size / _best_event_s(lambda: host.copy_(src, non_blocking=True), 3)
        return GpuFigures(tflops, bandwidth, h2d, d2h)

    def release(self, index: int) -> None:
        import torch

        with torch.cuda.device(index):
            torch.cuda.empty_cache()  # the buffers died with measure's frame


#: Seconds one timing sample lasts at least: many calls of a short kernel, so a
#: neighbour time-slicing the GPU is seen in the figure rather than slipped between.
SAMPLE_S = 0.02


def _best_event_s(fn: Any, repeats: int) -> float:
    """Seconds per call of ``fn`` on the current CUDA device: the best of ``repeats``
    samples, each ``SAMPLE_S`` or more of back-to-back calls timed by events on the
    current stream (after a warm-up call, and one more that sizes the samples)."""
    import torch

    def timed(calls: int) -> float:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    timed(1)  # warm-up: library handles, workspaces, the allocator's first blocks
    first = max(timed(1), 1e-6)
    calls = max(1, min(1000, math.ceil(SAMPLE_S / first)))
    best = min(timed(calls) / calls for _ in range(repeats))
    return max(best, 1e-9)
