"""compose.yaml's structure, without a container engine (this module runs in make test):
one image, a coordinator the agents wait for, the token required, nothing undeclared, and
the ``podman run`` lines the container test derives from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: composefile.py beside us
from composefile import ComposeError, interpolate, load, run_argv

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yaml"
ENV = {"HETERO_TOKEN": "t" * 64}


def test_the_demo_is_a_coordinator_and_two_agents_of_one_image() -> None:
    project = load(COMPOSE, ENV)
    names = [s.name for s in project.services]
    assert names[0] == "coordinator" and sorted(names[1:]) == ["node-a", "node-b"]
    assert {s.image for s in project.services} == {"localhost/hetero:latest"}
    coordinator, *agents = project.services
    assert coordinator.command == ["coordinator"]
    assert coordinator.ports == [("127.0.0.1", 7070, 7070)], "published on loopback only"
    for agent in agents:
        assert agent.command[:3] == ["agent", "--name", agent.name]
        assert agent.environment["HETERO_COORDINATOR"] == "coordinator:7070"
        assert agent.depends_on == {"coordinator": "service_healthy"}
        assert agent.networks == coordinator.networks
    volumes = [v for s in project.services for v, _ in s.volumes]
    assert len(set(volumes)) == 3, "each daemon keeps its own state"
    assert all(target == "/var/lib/hetero" for s in project.services for _, target in s.volumes)
    assert coordinator.healthcheck is not None
    assert coordinator.healthcheck["test"] == ["CMD", "hetero-entrypoint", "health"]


def test_every_container_needs_the_token_and_the_image_can_be_chosen() -> None:
    with pytest.raises(ComposeError, match="HETERO_TOKEN"):
        load(COMPOSE, {})
    project = load(COMPOSE, {**ENV, "HETERO_IMAGE": "registry.example/hetero:1"})
    assert all(s.environment["HETERO_TOKEN"] == ENV["HETERO_TOKEN"] for s in project.services)
    assert {s.image for s in project.services} == {"registry.example/hetero:1"}


def test_the_podman_lines_keep_the_token_out_of_argv_and_publish_a_free_port() -> None:
    project = load(COMPOSE, ENV, project="t1")
    coordinator = project.services[0]
    argv = run_argv(project, coordinator, any_host_port=True)
    assert ENV["HETERO_TOKEN"] not in " ".join(argv)
    assert argv[argv.index("--env") + 1] == "HETERO_TOKEN"
    assert argv[argv.index("--publish") + 1] == "127.0.0.1::7070"
    assert argv[argv.index("--network") + 1] == "t1_hetero"
    assert argv[argv.index("--volume") + 1] == "t1_coordinator-state:/var/lib/hetero"
    assert json.loads(argv[argv.index("--health-cmd") + 1]) == ["hetero-entrypoint", "health"]
    assert argv[-2:] == ["localhost/hetero:latest", "coordinator"]


def test_interpolation_follows_the_compose_specification() -> None:
    assert interpolate("${A:-x}/${B}", {"A": "", "B": "b"}) == "x/b"
    assert interpolate("${A:-x}", {"A": "a"}) == "a"
    with pytest.raises(ComposeError, match="A: say so"):
        interpolate("${A:?say so}", {})


def test_an_undeclared_volume_or_an_unknown_key_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("name: x\nservices:\n  a:\n    image: i\n    volumes: ['v:/d']\nvolumes: {}\n")
    with pytest.raises(ComposeError, match="volume 'v' is not declared"):
        load(bad, {})
    bad.write_text("name: x\nservices:\n  a:\n    image: i\n    privileged: true\n")
    with pytest.raises(ComposeError, match="privileged"):
        load(bad, {})
