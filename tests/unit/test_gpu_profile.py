"""A 2-GPU host through a fake NVML and a fake CUDA layer: figures above the device's
limits are re-measured once then marked suspect and not scored, a GPU shared with a
foreign process says so and scores lower, and the initial plan gives the unshared GPU
the larger share."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from hetero.agent.devicelimits import DeviceLimits, implausible, matmul_peak, memory_peak, pcie_peak
from hetero.agent.gpuprofile import GpuFigures, GpuProps
from hetero.agent.profile import DeviceMeasure, measure
from hetero.agent.sharing import ForeignLoad, sharing_factor, worth_reregistering
from hetero.agent.telemetry import TelemetrySampler
from hetero.client.render import profile_notes
from hetero.coordinator import wire
from hetero.coordinator.placement import DeviceSlot, place
from hetero.core.jobspec import parse_jobspec
from hetero.core.nvml import Nvml

NEIGHBOUR_PID = 4242
#: What an idle H100 SXM measures with the quick profile (bf16 2048^3, 64 MiB copies).
GOOD = GpuFigures(369.0, 2.2e12, 54.6e9, 53.0e9)
#: Work on GPU 1 timed on GPU 0: the clock stops before the work ends.
TIMED_ON_THE_WRONG_DEVICE = GpuFigures(2_000.0, 10.0e12, 6_226e9, 5_900e9)


class FakeNvml:
    """The third-party ``pynvml`` of a host with two H100 SXM: GPU 1 runs a neighbour."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2

    def __init__(self, utilization: tuple[int, int] = (0, 90), shared: int = 1) -> None:
        self.utilization = utilization
        self.shared = shared

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=1 << 30, total=80 << 30)

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return 5120

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=NEIGHBOUR_PID)] if handle == self.shared else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        return []

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=self.utilization[handle])


class FakeCuda:
    """The CUDA layer: GPU 0 measures plausibly, GPU 1 impossibly (every time)."""

    def __init__(self, figures: dict[int, list[GpuFigures]]) -> None:
        self.figures = figures
        self.calls: list[int] = []

    def device_count(self) -> int:
        return len(self.figures)

    def props(self, index: int) -> GpuProps:
        return GpuProps("NVIDIA H100 80GB HBM3", 80 << 30, 132, (9, 0))

    def measure(self, index: int, quick: bool) -> GpuFigures:
        self.calls.append(index)
        series = self.figures[index]
        return series[min(len(series), self.calls.count(index)) - 1]

    def release(self, index: int) -> None:
        pass


def test_the_limits_are_the_h100_datasheet_figures() -> None:
    assert memory_peak(5120, 2619) == pytest.approx(3.35e12, rel=0.01)
    assert pcie_peak((5, 16)) == pytest.approx(63e9, rel=0.01)
    assert matmul_peak(132, 1980, (9, 0)) == pytest.approx(1070, rel=0.01)
    assert matmul_peak(None, 1980, (9, 0)) is None


def test_without_nvml_limits_only_the_absurd_is_implausible() -> None:
    unknown = DeviceLimits()
    assert implausible(GOOD.values(), unknown) == {}
    assert set(implausible({"memory_bandwidth_bytes_per_s": 50e12}, unknown)) == {
        "memory_bandwidth_bytes_per_s"
    }
    assert set(implausible({"matmul_tflops": float("nan")}, unknown)) == {"matmul_tflops"}


def test_figures_above_the_limits_twice_are_suspect_warned_and_not_scored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cuda = FakeCuda({0: [GOOD], 1: [TIMED_ON_THE_WRONG_DEVICE]})
    with caplog.at_level(logging.WARNING, "hetero.agent.profile"):
        profile = measure(Nvml(FakeNvml()), quick=True, cuda=cuda)
    gpu0, gpu1 = profile.devices
    assert cuda.calls == [0, 1, 1]  # the implausible GPU alone is measured again
    assert gpu0.suspect == ()
    assert set(gpu1.suspect) == {
        "matmul_tflops",
        "memory_bandwidth_bytes_per_s",
        "host_to_device_bytes_per_s",
        "device_to_host_bytes_per_s",
    }
    # The suspect matmul is scored as its idle same-model sibling's, never as 2,000
    # TFLOP/s; the neighbour busy 90% of the time when it was profiled divides it by 1.9.
    assert gpu0.compute_score == 369.0
    assert gpu1.scored_tflops == 369.0
    assert gpu1.compute_score == pytest.approx(369.0 / 1.9)
    assert "suspect memory_bandwidth_bytes_per_s = 10,000.0 GB/s exceeds" in caplog.text
    assert "pids 4242" in caplog.text


def test_a_second_plausible_measurement_replaces_the_first() -> None:
    cuda = FakeCuda({0: [GOOD], 1: [TIMED_ON_THE_WRONG_DEVICE, GOOD]})
    gpu1 = measure(Nvml(FakeNvml()), quick=True, cuda=cuda).devices[1]
    assert gpu1.suspect == ()
    assert gpu1.memory_bandwidth_bytes_per_s == GOOD.memory_bandwidth_bytes_per_s


def test_a_gpu_used_by_another_process_while_profiled_says_so() -> None:
    cuda = FakeCuda({0: [GOOD], 1: [GOOD]})
    gpu0, gpu1 = measure(Nvml(FakeNvml()), quick=True, cuda=cuda).devices
    assert not gpu0.shared_while_profiled
    assert gpu1.foreign_pids == (NEIGHBOUR_PID,) and gpu1.shared_while_profiled
    assert gpu1.foreign_utilization_percent == 90.0  # read before measuring, neighbour alone
    assert gpu1.compute_score == pytest.approx(gpu0.compute_score / 1.9)
    msg0, msg1 = measure(Nvml(FakeNvml()), quick=True, cuda=cuda).device_messages()
    assert not msg0.shared_while_profiled and msg1.shared_while_profiled


def test_a_shared_gpu_without_an_idle_sibling_is_not_charged_its_neighbour_twice() -> None:
    # One GPU, measured at about half speed beside a neighbour busy 90% of the time: the
    # measurement already carries the contention, so the score is the measured figure.
    half = GpuFigures(369.0 / 1.9, 1.2e12, 30e9, 30e9)
    (gpu,) = measure(
        Nvml(FakeNvml(utilization=(90, 0), shared=0)), True, FakeCuda({0: [half]})
    ).devices
    assert gpu.shared_while_profiled and gpu.scored_tflops == pytest.approx(369.0)
    assert gpu.compute_score == pytest.approx(369.0 / 1.9)


def _telemetry_for(seconds: int, nvml: FakeNvml) -> TelemetrySampler:
    now = [0.0]
    sampler = TelemetrySampler(Nvml(nvml), [0, 1], clock=lambda: now[0])
    for t in range(1, seconds + 1):
        now[0] = float(t)
        sampler.sample()
    return sampler


def test_sustained_foreign_use_is_measured_from_telemetry_and_brief_use_is_not() -> None:
    brief = _telemetry_for(30, FakeNvml())
    assert brief.foreign.utilization_percent(1) is None
    sustained = _telemetry_for(70, FakeNvml())
    assert sustained.foreign.utilization_percent(0) == 0.0  # no process: not shared
    assert sustained.foreign.utilization_percent(1) == pytest.approx(90.0)


def test_our_own_ranks_never_count_as_foreign() -> None:
    load = ForeignLoad(window_s=10)
    for t in range(20):
        load.observe(0, float(t), 95.0, [NEIGHBOUR_PID], own_pids={NEIGHBOUR_PID})
    assert load.utilization_percent(0) == 0.0


def test_the_sharing_rule_divides_the_score_by_one_plus_foreign_utilization() -> None:
    assert sharing_factor(None) == 1.0 and sharing_factor(0.0) == 1.0
    assert sharing_factor(100.0) == 0.5
    assert sharing_factor(50.0) == pytest.approx(1 / 1.5)
    assert worth_reregistering(None, 90.0) and not worth_reregistering(90.0, 95.0)
    assert worth_reregistering(90.0, 0.0) and not worth_reregistering(90.0, None)
    d = DeviceMeasure(1, "cuda", "H100", 369.0, foreign_utilization_percent=90.0)
    assert d.compute_score == pytest.approx(369.0 / 1.9)


def test_the_initial_plan_gives_the_unshared_gpu_the_larger_share() -> None:
    """The issue's host: GPU 1 mis-timed and shared. Its profile must not invert the plan."""
    cuda = FakeCuda({0: [GOOD], 1: [TIMED_ON_THE_WRONG_DEVICE]})
    profile = measure(Nvml(FakeNvml()), quick=True, cuda=cuda)
    sampler = _telemetry_for(70, FakeNvml())
    from dataclasses import replace

    devices = tuple(
        replace(d, foreign_utilization_percent=sampler.foreign.utilization_percent(d.index))
        for d in profile.devices
    )
    messages = replace(profile, devices=devices).device_messages()
    slots = []
    for m in messages:
        row = wire.device_row(m)  # what the coordinator stores from the registration
        slots.append(
            DeviceSlot("n1", "n1", "10.0.0.1", row.index, row.kind, row.name, row.compute_score)
        )
        # ... and what `hetero-coord nodes` shows of it
        assert bool(profile_notes(wire.device_profile(row))) == (row.index == 1)
    spec = parse_jobspec(
        "name: t\nmodel: debug\nglobal_batch: 256\nsteps: 10\nresources: {ranks: 2}\n"
    )
    plan = place(spec, slots, master_port=29500).plan  # type: ignore[arg-type]
    assert sum(plan) == 256
    assert plan[0] > plan[1], plan


def test_samples_sparser_than_half_the_window_still_reach_a_verdict() -> None:
    load = ForeignLoad(window_s=60)
    for t in (0.0, 31.0, 62.0):
        load.observe(1, t, 50.0, [NEIGHBOUR_PID], own_pids=set())
    assert load.utilization_percent(1) == 50.0
    load.observe(1, 93.0, 0.0, [], own_pids=set())  # the neighbour left
    assert load.utilization_percent(1) == 0.0


def test_a_suspect_matmul_without_nvml_limits_or_sibling_is_capped_at_the_sanity_bound() -> None:
    class NoNvml:
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    absurd = GpuFigures(50_000.0, 1e12, 20e9, 20e9)
    (gpu,) = measure(Nvml(NoNvml()), True, FakeCuda({0: [absurd]})).devices
    assert gpu.suspect == ("matmul_tflops",)
    assert gpu.compute_score == 10_000.0  # never the 50,000 measured
