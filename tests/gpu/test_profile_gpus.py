"""The agent's hardware profile on every GPU of the host, as ``hetero-agent profile``
takes it (a fresh process, as the daemon does): each figure within the device's own
limits, and GPUs of one model alike when idle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hetero.agent.devicelimits import limits_from_nvml
from hetero.agent.gpuprofile import TorchCuda
from hetero.core.nvml import Nvml

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

#: Idle GPUs of one model measure within this of each other.
ALIKE = 0.15


def _agent_profile(state_dir: Path) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.agent.cli",
            "profile",
            "--json",
            "--refresh-profile",
            "--state-dir",
            str(state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    print(done.stderr)
    profile: dict[str, Any] = json.loads(done.stdout)
    return profile


def test_every_gpu_is_profiled_on_itself_within_its_limits_and_alike_when_idle(
    tmp_path: Path,
) -> None:
    devices = _agent_profile(tmp_path)["devices"]
    cuda, nvml = TorchCuda(), Nvml()
    assert [d["index"] for d in devices] == list(range(cuda.device_count()))
    for d in devices:
        props = cuda.props(d["index"])
        limits = limits_from_nvml(
            nvml, d["index"], sm_count=props.sm_count, capability=props.capability
        )
        print(
            f"cuda:{d['index']} {d['name']}: {d['matmul_tflops']:.0f} TFLOP/s "
            f"(peak {limits.matmul_tflops or 0:.0f}), "
            f"memory {d['memory_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s "
            f"(peak {(limits.memory_bandwidth_bytes_per_s or 0) / 1e9:.0f}), "
            f"H2D {d['host_to_device_bytes_per_s'] / 1e9:.1f} GB/s "
            f"(peak {(limits.host_to_device_bytes_per_s or 0) / 1e9:.1f}), "
            f"foreign pids {d['foreign_pids'] or 'none'}"
        )
        assert d["kind"] == "cuda" and d["suspect"] == [], d
        # The check used the device's own limits, not the sanity bounds.
        assert limits.matmul_tflops and limits.memory_bandwidth_bytes_per_s, limits
        assert d["matmul_tflops"] <= limits.matmul_tflops
    idle: dict[str, list[dict[str, Any]]] = {}
    for d in devices:
        if not d["foreign_pids"]:
            idle.setdefault(d["name"], []).append(d)
    groups = [g for g in idle.values() if len(g) >= 2]
    if not groups:
        pytest.skip("no two idle GPUs of one model to compare")
    # Host-to-device is left out: it depends on which CPU socket the pinned buffer
    # sits on, which differs between the GPUs of one dual-socket host.
    for group in groups:
        for field in ("matmul_tflops", "memory_bandwidth_bytes_per_s"):
            values = [d[field] for d in group]
            assert max(values) <= (1 + ALIKE) * min(values), (group[0]["name"], field, values)
