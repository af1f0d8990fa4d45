"""A neighbour on one GPU lowers that GPU's score at the coordinator, and leaving restores it.

The real agent (its link, telemetry thread and loop) against the real coordinator on
port 0; only NVML is a stand-in (a host with two GPUs; a foreign process on GPU 1,
busy 80%), and the agent's clock runs 30 times faster than the wall clock so its
60 s telemetry window fills in seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hetero.agent.config import AgentConfig
from hetero.agent.daemon import Agent
from hetero.agent.profile import DeviceMeasure, NodeProfile
from hetero.core.nvml import Nvml
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

pytestmark = pytest.mark.slow


class NeighbourNvml:
    """``pynvml`` of two GPUs; process 4242 on GPU 1 while ``present``. Fields it lacks
    are "n/a" to the agent."""

    def __init__(self) -> None:
        self.present = True

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=80 if handle == 1 and self.present else 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=4242)] if handle == 1 and self.present else []


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sustained_foreign_use_lowers_the_registered_score_and_its_end_restores_it(
    coordinator: Any, tmp_path: Path
) -> None:
    fake = NeighbourNvml()
    gpus = tuple(DeviceMeasure(i, "cuda", "H100", 400.0) for i in range(2))
    profile = NodeProfile("test cpu", 2, 10.0, 1 << 30, gpus)
    config = AgentConfig(
        coordinator=coordinator.address,
        name="shared-node",
        address="127.0.0.1",
        local_listen="127.0.0.1:0",
        state_dir=tmp_path / "agent",
    )
    agent = Agent(config, profile, nvml=Nvml(fake), clock=lambda: time.time() * 30)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()

    def gpu(index: int) -> tpb.DeviceProfile | None:
        nodes = coordinator.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes
        found = [d for n in nodes for d in n.devices if d.index == index]
        return found[0] if found else None

    try:
        _wait_for("the registration", lambda: gpu(1) is not None)
        _wait_for(
            "GPU 1 scored as shared",
            lambda: (d := gpu(1)) is not None and d.HasField("foreign_utilization_percent"),
        )
        shared, alone = gpu(1), gpu(0)
        assert shared is not None and alone is not None
        assert shared.foreign_utilization_percent == pytest.approx(80.0)
        assert shared.compute_score == pytest.approx(400.0 / 1.8)
        assert alone.compute_score == 400.0 and not alone.HasField("foreign_utilization_percent")
        fake.present = False
        _wait_for(
            "GPU 1's score restored",
            lambda: (d := gpu(1)) is not None and d.compute_score == 400.0,
        )
        restored = gpu(1)
        assert restored is not None and not restored.HasField("foreign_utilization_percent")
    finally:
        agent.stop()
        thread.join(timeout=15)
    assert not thread.is_alive()
