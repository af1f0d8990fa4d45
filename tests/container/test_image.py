"""The container image, built and run with podman (``make test-container``).

Set-up, once per module: ``make image`` builds the image offline (a Debian base made
with debootstrap and ``podman import``, every wheel from the wheelhouse), timed. The
demo test then starts the services of ``compose.yaml`` with ``podman run`` (the file's
own lines, ``composefile.run_argv``: podman-compose need not be installed), a
coordinator and two agents on a bridge network, submits ``examples/demo.yaml`` from
this host through the published port and checks it SUCCEEDED with ranks on both
agents. Figures (build seconds, image bytes, demo seconds) go to
``build/container/figures.json``. Without podman the module skips with one line.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: composefile.py
from composefile import Project, load, run_argv

# The first build takes minutes (debootstrap, then pip installing torch in the image).
pytestmark = [pytest.mark.container, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"
DEMO = REPO / "examples" / "demo.yaml"
FIGURES = REPO / "build" / "container" / "figures.json"
IMAGE = os.environ.get("HETERO_IMAGE", "localhost/hetero:latest")
PODMAN = shutil.which("podman")
#: What podman needs on a host whose runc cannot set the engine's default ulimits.
CONTAINERS_CONF = Path("/etc/containers/containers.conf")

if PODMAN is None:
    pytest.skip("podman absent (Debian: apt-get install podman runc)", allow_module_level=True)


def podman(
    *args: str, timeout_s: float = 120.0, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    assert PODMAN is not None
    done = subprocess.run(
        [PODMAN, *args], capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done


def _figures(**values: float) -> None:
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    have = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    FIGURES.write_text(json.dumps({**have, **values}, indent=2) + "\n")


@dataclass(frozen=True)
class Image:
    name: str
    size_bytes: int


@pytest.fixture(scope="module")
def image() -> Image:
    if not CONTAINERS_CONF.exists() and os.geteuid() == 0:
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text("[containers]\ndefault_ulimits = []\n")
    started = time.perf_counter()
    built = subprocess.run(
        ["make", "-s", "image", f"IMAGE={IMAGE}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if built.returncode != 0:
        raise AssertionError(f"make image failed:\n{built.stdout[-3000:]}{built.stderr[-3000:]}")
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    _figures(image_bytes=size, make_image_s=round(time.perf_counter() - started, 1))
    return Image(IMAGE, size)


def test_the_image_runs_as_a_non_root_user_and_stays_small(image: Image) -> None:
    uid = podman("run", "--rm", image.name, "id", "-u").stdout.strip()
    assert uid != "0", "the daemons run as the image's hetero user"
    config = json.loads(podman("image", "inspect", image.name).stdout)[0]
    healthcheck = config.get("Healthcheck")  # kept because the build uses --format docker
    assert healthcheck and healthcheck["Test"] == ["CMD", "hetero-entrypoint", "health"]
    # A CPU build of torch is most of it; a CUDA build would add about 3 GB.
    assert image.size_bytes < 1_500_000_000, image.size_bytes
    imports = "import torch, hetero.coordinator.cli, hetero.agent.cli, hetero.trainer.cli"
    loaded = podman("run", "--rm", image.name, "python3", "-c", f"{imports}; print('ok')")
    assert loaded.stdout == "ok\n", loaded.stdout + loaded.stderr


@pytest.fixture
def demo(image: Image) -> Iterator[tuple[Project, dict[str, str]]]:
    """compose.yaml's services under a project name of the test's own, started in order;
    everything it made is removed afterwards, each container's last log lines printed first."""
    name = f"hetero-test-{secrets.token_hex(3)}"
    env = {**os.environ, "HETERO_TOKEN": secrets.token_hex(32), "HETERO_IMAGE": image.name}
    project = load(COMPOSE, env, project=name)
    try:
        for net in project.networks:
            podman("network", "create", project.resource(net))
        for vol in project.volumes:
            podman("volume", "create", project.resource(vol))
        for service in project.services:
            for dep, condition in service.depends_on.items():
                if condition == "service_healthy":
                    _wait_healthy(project.container(dep))
            podman(
                *run_argv(project, service, any_host_port=True), env={**env, **service.environment}
            )
        yield project, env
    finally:
        for service in reversed(project.services):
            container = project.container(service.name)
            logs = podman("logs", "--tail", "30", container, check=False)
            print(f"--- {container}\n{logs.stdout}{logs.stderr}")
            podman("rm", "-f", "-t", "5", container, check=False)
        for vol in project.volumes:
            podman("volume", "rm", "-f", project.resource(vol), check=False)
        for net in project.networks:
            podman("network", "rm", "-f", project.resource(net), check=False)


def _wait_healthy(container: str, timeout_s: float = 120.0) -> None:
    """Run the container's HEALTHCHECK until it passes (podman runs it on demand)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = podman("healthcheck", "run", container, check=False)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{container} unhealthy after {timeout_s:g} s: {done.stdout}{done.stderr}"
            )
        time.sleep(2.0)


def _client(
    address: str, env: dict[str, str], *args: str, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hetero.coordinator.cli", *args, "--coordinator", address],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def test_coordinator_and_two_agent_containers_run_the_demo_job_to_success(demo) -> None:  # type: ignore[no-untyped-def]
    project, env = demo
    coordinator = project.container("coordinator")
    published = podman("port", coordinator, "7070/tcp").stdout.strip().splitlines()[0]
    address = published.replace("0.0.0.0", "127.0.0.1")
    deadline = time.monotonic() + 300.0  # agents profile their CPU (--quick) before registering
    names: set[str] = set()
    while names != {"node-a", "node-b"}:
        nodes = _client(address, env, "nodes", "--json")
        if nodes.returncode == 0:
            names = {
                n["name"] for n in json.loads(nodes.stdout).get("nodes", []) if n.get("healthy")
            }
        assert time.monotonic() < deadline, f"agents registered: {sorted(names)}; {nodes.stderr}"
        time.sleep(2.0)
    started = time.perf_counter()
    submitted = _client(address, env, "submit", str(DEMO), "--wait", "--json", timeout_s=1800.0)
    demo_s = time.perf_counter() - started
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    job = json.loads(submitted.stdout)
    assert job["state"] == "SUCCEEDED", job.get("message")
    assert {r["node_name"] for r in job["ranks"]} == {"node-a", "node-b"}, "ranks on both agents"
    _figures(demo_job_s=round(demo_s, 1))
    for service in project.services:  # the HEALTHCHECK of each container passes
        assert (
            podman("healthcheck", "run", project.container(service.name), check=False).returncode
            == 0
        )
    assert podman("exec", coordinator, "id", "-u").stdout.strip() != "0"
