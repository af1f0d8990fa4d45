"""A host that runs only the coordinator or hetero-top installs hetero without torch.

torch and torchvision are the ``train`` extra (``pip install 'hetero[train]'``), not
dependencies of hetero itself; here the daemons and the UI run in interpreters where
``import torch`` fails, as on such a host: a ``sitecustomize`` on ``PYTHONPATH``
puts a finder first on ``sys.meta_path`` that refuses torch and torchvision, in the
command and in every process it starts (the coordinator's workers too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
TRAINING = {"torch", "torchvision"}
LISTENING = re.compile(r"coordinator listening on \S+ \(port (\d+)")

NO_TORCH = '''\
import sys


class _NoTorch:
    """torch and torchvision, as if they were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "torchvision"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
'''


@pytest.fixture
def no_torch(tmp_path: Path) -> dict[str, str]:
    """An environment whose interpreters cannot import torch (checked first, so the
    tests below cannot pass because torch came in anyway)."""
    site = tmp_path / "no-torch"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TORCH)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    blocked = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True
    )
    assert blocked.returncode == 1 and "No module named 'torch'" in blocked.stderr
    return env


def _command(function: str, *argv: str) -> list[str]:
    """What the console script ``hetero-<function>`` runs: ``hetero.entry.<function>``."""
    code = f"import sys; from hetero import entry; sys.exit(entry.{function}())"
    return [sys.executable, "-c", code, *argv]


def test_torch_is_the_train_extra_not_a_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {Requirement(r).name for r in project["dependencies"]}
    assert not base & TRAINING, f"base dependencies name {sorted(base & TRAINING)}"
    extras = project["optional-dependencies"]
    assert {Requirement(r).name for r in extras["train"]} >= TRAINING
    assert "hetero[train]" in extras["dev"]


@pytest.mark.parametrize(("function", "prog"), [("coord", "hetero-coord"), ("top", "hetero-top")])
def test_hetero_coord_and_hetero_top_answer_help_without_torch(
    no_torch: dict[str, str], function: str, prog: str
) -> None:
    done = subprocess.run(
        _command(function, "--help"), env=no_torch, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert f"usage: {prog}" in done.stdout and done.stderr == ""


@pytest.mark.slow
def test_hetero_coord_serves_and_answers_health_without_torch(
    no_torch: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "coordinator.log"
    argv = ["serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")]
    argv += ["--db", f"sqlite:///{tmp_path / 'coordinator.db'}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            _command("coord", *argv), env=no_torch, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while (
            found := re.search(r"coordinator listening on \S+ \(port (\d+)", log.read_text())
        ) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with grpc.insecure_channel(f"127.0.0.1:{found[1]}") as channel:
            health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()
