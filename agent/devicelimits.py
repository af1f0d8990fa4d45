"""What a GPU can physically do, from NVML, and which measured figures exceed it.

A profile figure above the device's own peak is not fast hardware but a broken
measurement (work timed on one device with events or a synchronise on another
shows a GPU finishing before it started). The peaks:

- memory bandwidth = bus width (bits) / 8 × the maximum memory clock × 2 (double
  data rate): 5120 bit × 2619 MHz × 2 = 3.35 TB/s on an H100 SXM;
- host-to-device = the per-lane rate of the maximum PCIe generation × lanes:
  Gen5 × 16 = 63 GB/s;
- matmul = SMs × the maximum SM clock × the architecture's dense bf16/fp16
  tensor FLOP per clock per SM (``FLOP_PER_CLOCK_PER_SM``): 132 × 1980 MHz ×
  4096 = 1,070 TFLOP/s on an H100 SXM.

NVML reports none of these peaks itself (nor does nvitop, built on it), only the
fields they follow from; the table of FLOP per clock is ours for that reason.
Where NVML cannot say (no driver field, an unknown architecture), a generous
sanity bound stands in (``SANITY``): it only catches the absurd. Pure: no NVML,
no torch; :func:`limits_from_nvml` reads the fields through ``Nvml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetero.core.nvml import Nvml

#: Dense tensor-core bf16/fp16 FLOP per clock per SM by compute capability (major,
#: minor), from the vendors' published peaks: V100 125 TFLOP/s = 80 SMs × 1530 MHz ×
#: 1024; A100 312 = 108 × 1410 × 2048; H100 SXM 989 = 132 × 1830 × 4096; B200 2250
#: ≈ 148 × 1965 × 8192 (rounded up). Consumer parts (8.6, 8.9, 12.0) list 512 with an
#: fp32 accumulator and 1024 with fp16; the larger is kept: the bound must never be
#: below what the device can reach.
FLOP_PER_CLOCK_PER_SM: dict[tuple[int, int], int] = {
    (7, 0): 1024,
    (7, 2): 1024,
    (7, 5): 1024,
    (8, 0): 2048,
    (8, 6): 1024,
    (8, 7): 1024,
    (8, 9): 1024,
    (9, 0): 4096,
    (10, 0): 8192,
    (12, 0): 1024,
}
#: Unknown architecture: the largest entry above.
FLOP_PER_CLOCK_PER_SM_UNKNOWN = max(FLOP_PER_CLOCK_PER_SM.values())

#: PCIe payload bytes/s per lane by generation (after line coding: 8b/10b for 1-2,
#: 128b/130b from 3 on; Gen6 with FLIT overhead).
PCIE_LANE_BYTES_PER_S: dict[int, float] = {
    1: 0.25e9,
    2: 0.5e9,
    3: 0.985e9,
    4: 1.969e9,
    5: 3.938e9,
    6: 7.563e9,
}

#: A measurement may exceed the computed peak by this fraction (clock reporting,
#: rounding in the published per-SM figure) before it is implausible.
TOLERANCE = 0.10

#: Profile fields the check covers, with their units for messages.
FIELDS: dict[str, str] = {
    "matmul_tflops": "TFLOP/s",
    "memory_bandwidth_bytes_per_s": "B/s",
    "host_to_device_bytes_per_s": "B/s",
    "device_to_host_bytes_per_s": "B/s",
}


@dataclass(frozen=True)
class DeviceLimits:
    """Peaks of one GPU; ``None`` = unknown (the sanity bound applies). Units as in
    ``DeviceMeasure``: TFLOP/s and bytes/s. ``device_to_host`` shares the link's peak."""

    matmul_tflops: float | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    host_to_device_bytes_per_s: float | None = None

    def bound(self, field: str) -> float:
        """The largest plausible value of ``field`` (the peak plus ``TOLERANCE``)."""
        key = "host_to_device_bytes_per_s" if field == "device_to_host_bytes_per_s" else field
        peak = getattr(self, key)
        return SANITY[key] if peak is None else min(peak * (1 + TOLERANCE), SANITY[key])


#: Far above any device built so far: 10 PFLOP/s dense, 20 TB/s HBM, 1 TB/s host link
#: (a coherent CPU-GPU link like NVLink-C2C included, which PCIe fields do not describe).
SANITY: dict[str, float] = {
    "matmul_tflops": 10_000.0,
    "memory_bandwidth_bytes_per_s": 20e12,
    "host_to_device_bytes_per_s": 1e12,
}


def memory_peak(bus_width_bits: int | None, mem_clock_mhz: float | None) -> float | None:
    if not bus_width_bits or not mem_clock_mhz:
        return None
    return bus_width_bits / 8 * mem_clock_mhz * 1e6 * 2


def pcie_peak(link: tuple[int, int] | None) -> float | None:
    if link is None or link[0] not in PCIE_LANE_BYTES_PER_S or link[1] <= 0:
        return None
    return PCIE_LANE_BYTES_PER_S[link[0]] * link[1]


def matmul_peak(
    sm_count: int | None, sm_clock_mhz: float | None, capability: tuple[int, int] | None
) -> float | None:
    """Dense tensor TFLOP/s; ``None`` without an SM count or clock."""
    if not sm_count or not sm_clock_mhz:
        return None
    per_sm = FLOP_PER_CLOCK_PER_SM.get(capability or (0, 0), FLOP_PER_CLOCK_PER_SM_UNKNOWN)
    return sm_count * sm_clock_mhz * 1e6 * per_sm / 1e12


def limits_from_nvml(
    nvml: Nvml, index: int, *, sm_count: int | None, capability: tuple[int, int] | None
) -> DeviceLimits:
    """GPU ``index``'s peaks. ``sm_count`` and ``capability`` come from the CUDA runtime
    (NVML reports neither on every driver)."""
    return DeviceLimits(
        matmul_tflops=matmul_peak(sm_count, nvml.max_clock_mhz(index, "sm"), capability),
        memory_bandwidth_bytes_per_s=memory_peak(
            nvml.memory_bus_width_bits(index), nvml.max_clock_mhz(index, "mem")
        ),
        host_to_device_bytes_per_s=pcie_peak(nvml.max_pcie_link(index)),
    )


def implausible(values: dict[str, float | None], limits: DeviceLimits) -> dict[str, str]:
    """The measured ``values`` that no device like this can reach, with why.

    A figure is implausible when it is not a finite positive number or it exceeds
    ``limits.bound``; ``None`` (not measured) never is.
    """
    out: dict[str, str] = {}
    for field, value in values.items():
        if value is None or field not in FIELDS:
            continue
        bound = limits.bound(field)
        if not (math.isfinite(value) and value > 0):
            out[field] = f"{field} = {value} is not a positive number"
        elif value > bound:
            out[field] = (
                f"{field} = {_fmt(value, field)} exceeds the device's limit {_fmt(bound, field)}"
            )
    return out


def _fmt(value: float, field: str) -> str:
    if field == "matmul_tflops":
        return f"{value:,.0f} TFLOP/s"
    return f"{value / 1e9:,.1f} GB/s"
