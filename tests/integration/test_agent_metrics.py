"""An agent's own ``/metrics`` (``hetero-agent run --metrics-listen``): this node's host
and device telemetry under the series names the coordinator used to export, served over
real HTTP by prometheus-client's server on port 0."""

from __future__ import annotations

import urllib.request

import pytest

from hetero.agent.config import AgentConfig
from hetero.agent.metrics import NodeCollector, serve_metrics
from hetero.agent.profile import DeviceMeasure, NodeProfile
from hetero.agent.telemetry import HostSample, Snapshot
from hetero.core.errors import ConfigError
from hetero.core.nvml import GpuSample

PROFILE = NodeProfile(
    "test cpu",
    2,
    10.0,
    1 << 30,
    (DeviceMeasure(0, "cuda", "H100", 400.0), DeviceMeasure(1, "cpu", "test cpu", 1.0)),
    emulated_slowdown=2.0,
)
SNAPSHOT = Snapshot(
    1.0,
    HostSample(cpu_percent=50.0, ram_used_bytes=1 << 29, ram_total_bytes=1 << 30),
    (
        GpuSample(
            0,
            utilization_percent=80.0,
            temperature_c=60.0,
            power_w=300.0,
            sm_clock_mhz=1500.0,
            throttle_reasons=(),
        ),
    ),
    cpu_indexes=(1,),
)


def test_the_agent_serves_its_devices_telemetry_under_the_dashboards_names() -> None:
    server = serve_metrics("127.0.0.1:0", NodeCollector("gpu-a", PROFILE, lambda: SNAPSHOT))
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'hetero_host_cpu_utilization_ratio{node="gpu-a"} 0.5' in text
    assert 'hetero_device_utilization_ratio{device="0",node="gpu-a"} 0.8' in text
    assert 'hetero_device_sm_clock_hertz{device="0",node="gpu-a"} 1.5e+09' in text
    assert 'hetero_device_throttled{device="0",node="gpu-a"} 0.0' in text
    assert 'hetero_device_info{device="0",kind="cuda",name="H100",node="gpu-a"} 1.0' in text
    assert 'hetero_device_emulated_slowdown{device="0",node="gpu-a"} 2.0' in text
    assert 'hetero_device_utilization_ratio{device="1",node="gpu-a"} 0.5' in text, "the host's"
    assert 'hetero_device_power_watts{device="0",node="gpu-a"} 300.0' in text
    assert 'hetero_device_memory_used_bytes{device="0"' not in text, "n/a is left out"
    assert 'hetero_device_memory_used_bytes{device="1",node="gpu-a"}' in text


def test_a_metrics_listen_without_a_port_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^metrics_listen must be host:port, got '9100'$"):
        AgentConfig(metrics_listen="9100")
    with pytest.raises(ConfigError, match="host:port"):
        serve_metrics("9100", NodeCollector("n", PROFILE, lambda: SNAPSHOT))
