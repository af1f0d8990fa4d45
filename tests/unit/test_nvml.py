"""The NVML helper degrades to "n/a" instead of crashing, and logs each failure once."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from hetero.agent.telemetry import Snapshot, TelemetrySampler
from hetero.core.nvml import Nvml, throttle_names


class NVMLError(Exception):
    pass


class FakeNvml:
    """A stand-in for the third-party ``pynvml`` module: one GPU without power readings."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("gpu", index)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(used=2 << 30, total=16 << 30)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=87)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return 61

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        raise NVMLError("Not Supported")

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        return 1410

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return 0x4 | 0x40


def test_without_nvml_every_gpu_field_is_na_and_nothing_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Missing:
        def nvmlInit(self) -> None:
            raise NVMLError("NVML Shared Library Not Found")

    nvml = Nvml(Missing())
    with caplog.at_level(logging.INFO, logger="hetero.core.nvml"):
        assert not nvml.available
        assert nvml.device_count() == 0
        sample = nvml.sample(0)
        nvml.sample(0)
    assert sample.utilization_percent is None and sample.power_w is None
    assert sample.throttle_reasons is None
    assert len([r for r in caplog.records if "not available" in r.message]) == 1


def test_on_this_machine_the_real_module_degrades_or_works() -> None:
    nvml = Nvml()  # real pynvml: on a CPU box the driver library is missing
    sample = nvml.sample(0) if nvml.device_count() == 0 else None
    if sample is not None:
        assert sample.memory_total_bytes is None


def test_one_unsupported_field_is_na_alone_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = Nvml(FakeNvml())
    with caplog.at_level(logging.INFO, logger="hetero.core.nvml"):
        first = nvml.sample(0)
        nvml.sample(0)
    assert first.power_w is None, "unsupported power is n/a"
    assert first.utilization_percent == 87.0 and first.temperature_c == 61.0
    assert first.memory_total_bytes == 16 << 30 and first.sm_clock_mhz == 1410.0
    assert first.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert len([r for r in caplog.records if "power" in r.message]) == 1


def test_heartbeat_leaves_na_fields_unset_and_uses_the_injected_clock() -> None:
    sampler = TelemetrySampler(Nvml(FakeNvml()), [0], clock=lambda: 1234.5)
    snap: Snapshot = sampler.latest()
    assert snap.time_unix_s == 1234.5
    req = snap.heartbeat("node")
    (gpu,) = req.devices
    assert not gpu.HasField("power_w") and gpu.HasField("temperature_c")
    assert list(gpu.throttle.reasons) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert req.host.HasField("ram_total_bytes")


def test_throttle_names_of_an_idle_mask() -> None:
    assert throttle_names(0) == ()
    assert throttle_names(0x1) == ("gpu_idle",)


def test_cpu_devices_report_the_hosts_utilization_and_memory() -> None:
    sampler = TelemetrySampler(Nvml(FakeNvml()), [], cpu_indexes=[0], clock=lambda: 1.0)
    req = sampler.latest().heartbeat("node")
    (cpu,) = req.devices
    assert cpu.device_index == 0
    assert cpu.memory_total_bytes == req.host.ram_total_bytes > 0
    assert cpu.HasField("utilization_percent") == req.host.HasField("cpu_percent")
