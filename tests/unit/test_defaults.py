"""Shared defaults are written once (hetero.core.defaults) and every reader agrees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hetero.agent.config import AgentConfig
from hetero.agent.config import load_config as load_agent_config
from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.coordinator import cluster, service
from hetero.coordinator.config import CoordinatorConfig
from hetero.coordinator.config import load_config as load_coordinator_config
from hetero.core import defaults


def _default(cls: type, name: str) -> object:
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


def test_the_coordinators_config_settings_and_rules_share_the_defaults() -> None:
    for name, value in (
        ("heartbeat_interval_s", defaults.HEARTBEAT_INTERVAL_S),
        ("heartbeat_timeout_s", defaults.HEARTBEAT_TIMEOUT_S),
        ("master_port_base", defaults.MASTER_PORT_BASE),
    ):
        assert getattr(CoordinatorConfig(), name) == value
        assert _default(service.Settings, name) == value
    assert _default(service.Settings, "master_port_span") == defaults.MASTER_PORT_SPAN
    assert _default(cluster.Rules, "master_port_base") == defaults.MASTER_PORT_BASE
    assert _default(cluster.Rules, "master_port_span") == defaults.MASTER_PORT_SPAN
    assert CoordinatorConfig().listen == defaults.COORDINATOR_ADDRESS


def test_an_empty_config_file_means_the_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    assert load_coordinator_config(empty) == CoordinatorConfig()
    assert load_agent_config(empty) == AgentConfig()
    assert AgentConfig().coordinator == defaults.COORDINATOR_ADDRESS
    assert AgentConfig().local_listen == defaults.AGENT_LOCAL_ADDRESS


def test_the_local_cluster_runs_the_daemons_defaults(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, [AgentSpec("a")])
    assert cluster.heartbeat_timeout_s == defaults.HEARTBEAT_TIMEOUT_S
    assert cluster.heartbeat_interval_s == defaults.HEARTBEAT_INTERVAL_S
