"""A rank's GPU utilisation and memory per interval (trainer.gpustats): the means over an
interval's readings, and null wherever NVML or a GPU is absent."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hetero.core.nvml import Nvml
from hetero.trainer.gpustats import (
    NOT_AVAILABLE,
    GpuReading,
    GpuSampler,
    IntervalMeans,
    nvml_reader,
    open_sampler,
)


def test_an_interval_takes_the_mean_of_its_readings_and_the_next_starts_empty() -> None:
    means = IntervalMeans()
    for util, memory in ((20.0, 10.0), (40.0, 30.0), (90.0, 50.0)):
        means.add(GpuReading(util, memory))
    assert means.take() == GpuReading(50.0, 30.0)
    means.add(GpuReading(10.0, 60.0))
    assert means.take() == GpuReading(10.0, 60.0), "readings of the last interval are gone"


def test_each_field_is_averaged_over_the_readings_that_have_it() -> None:
    means = IntervalMeans()
    means.add(GpuReading(30.0, None))  # a driver that did not answer for memory once
    means.add(GpuReading(50.0, 25.0))
    assert means.take() == GpuReading(40.0, 25.0)
    means.add(GpuReading(None, None))
    means.add(GpuReading(None, 70.0))
    assert means.take() == GpuReading(None, 70.0)


def test_an_interval_without_a_reading_takes_the_newest_before_it() -> None:
    means = IntervalMeans()
    assert means.take() == NOT_AVAILABLE, "never read: null"
    means.add(GpuReading(64.0, 12.0))
    means.add(NOT_AVAILABLE)  # a failed reading does not replace the newest good one
    assert means.take() == GpuReading(64.0, 12.0)
    assert means.take() == GpuReading(64.0, 12.0), "shorter than the period: the newest"


def test_the_sampler_reads_off_the_caller_thread_and_averages_what_it_read() -> None:
    returned: list[GpuReading] = []
    enough = threading.Event()
    callers: set[int] = set()

    def read() -> GpuReading:
        callers.add(threading.get_ident())
        reading = GpuReading(10.0 * (len(returned) + 1), 5.0)
        returned.append(reading)
        if len(returned) >= 4:
            enough.set()
        return reading

    sampler = GpuSampler(read, period_s=0.005).start()
    assert enough.wait(10.0)
    sampler.stop()
    n = len(returned)
    assert sampler.take() == GpuReading(sum(r.util_percent or 0 for r in returned) / n, 5.0)
    assert threading.get_ident() not in callers, "no NVML call on the training thread"
    assert len(returned) == n, "stopped: no more readings"


class FakePynvml:
    """A stand-in for the third-party ``pynvml`` module: one GPU, 4 of 10 GiB in use."""

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        return ("gpu", uuid)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=87, memory=12)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(used=4 << 30, total=10 << 30)


def test_a_reading_is_nvml_utilisation_and_memory_in_use_over_total() -> None:
    read = nvml_reader(Nvml(FakePynvml()), ("gpu", "GPU-0"))
    assert read() == GpuReading(87.0, 40.0)


def test_a_field_nvml_cannot_read_is_null() -> None:
    class NoMemoryInfo(FakePynvml):
        def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
            raise RuntimeError("Not Supported")

    assert nvml_reader(Nvml(NoMemoryInfo()), "h")() == GpuReading(87.0, None)


def test_a_cpu_rank_has_no_sampler() -> None:
    assert open_sampler(torch.device("cpu"), Nvml(FakePynvml())) is None


def test_without_nvml_a_gpu_rank_has_no_sampler_and_its_fields_are_null() -> None:
    class Missing:
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    assert open_sampler(torch.device("cuda", 0), Nvml(Missing())) is None


def test_on_this_host_without_a_driver_the_real_nvml_gives_null() -> None:
    nvml = Nvml()
    if nvml.available:
        pytest.skip("NVML is present on this host")
    assert open_sampler(torch.device("cuda", 0), nvml) is None
