"""Layering: each entry point loads only what it uses, and the import contracts hold.

Two checks. What each entry point really loads at start (a fresh interpreter
per entry point, the modules it must not load absent from ``sys.modules``), and
import-linter's contracts in pyproject.toml over every import in the code,
those inside functions too: every package in one layers contract (bench over the
coordinator, agent, trainer and TUI, which never import one another, over the
client commands of hetero-coord, over the security layer and the gRPC contract, over
core), and forbidden contracts for
the heavy libraries. The agent never trains, so it loads no torch; it keeps no
database, so no SQLAlchemy; ``hetero.core`` is what every package shares, so it
needs only the standard library and PyYAML; the balancer runs inside every
training process, so it is pure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "sqlalchemy", "grpc", "google.protobuf", "textual", "rich", "yaml")

ENTRY_POINTS = {
    # hetero-agent: its CLI, and the daemon it starts.
    "hetero.agent.cli": (
        "torch",
        "sqlalchemy",
        "hetero.trainer",
        "hetero.coordinator",
        "hetero.tui",
        "hetero.bench",
    ),
    "hetero.agent.daemon": (
        "torch",
        "sqlalchemy",
        "hetero.trainer",
        "hetero.coordinator",
        "hetero.tui",
        "hetero.bench",
    ),
    # hetero-top.
    "hetero.tui.app": ("torch", "sqlalchemy", "hetero.trainer", "hetero.coordinator"),
    "hetero.tui.cli": ("torch", "sqlalchemy", "hetero.trainer", "hetero.coordinator"),
    # hetero-top --run: a run's files only, no coordinator client either.
    "hetero.tui.runapp": ("torch", "sqlalchemy", "grpc", "hetero.trainer", "hetero.coordinator"),
    # hetero-coord: no torch, no UI, nothing of the programs it serves.
    "hetero.coordinator.cli": (
        "torch",
        "textual",
        "pynvml",
        "hetero.trainer",
        "hetero.agent",
        "hetero.tui",
        "hetero.bench",
    ),
    # hetero-coord's client commands: gRPC and rich, no database, nothing of the daemon.
    "hetero.client.commands": (
        "torch",
        "sqlalchemy",
        "alembic",
        "textual",
        "hetero.coordinator",
        "hetero.trainer",
        "hetero.agent",
        "hetero.tui",
        "hetero.bench",
    ),
    # hetero-train: the training library, never the TUI (--top runs hetero-top as a
    # program) nor a database.
    "hetero.trainer.cli": ("sqlalchemy", "textual", "hetero.tui", "hetero.bench"),
    # The console scripts' module: each command's module only once it runs.
    "hetero.entry": (
        *HEAVY,
        "hetero.coordinator",
        "hetero.agent",
        "hetero.trainer",
        "hetero.tui",
        "hetero.bench",
        "hetero.security",
    ),
    # The security layer: gRPC and core, nothing of the daemons that use it.
    "hetero.security.transport": (
        "torch",
        "sqlalchemy",
        "textual",
        "rich",
        "yaml",
        "hetero.v1",
        "hetero.coordinator",
        "hetero.agent",
        "hetero.trainer",
        "hetero.tui",
    ),
    # NVML, shared by the agent and the ranks: nvidia-ml-py only on first use.
    "hetero.core.nvml": (*HEAVY, "pynvml", "hetero.v1"),
    # The shared agreements: standard library and PyYAML only.
    "hetero.core.errors": (*HEAVY[:-1], "hetero.v1"),
    "hetero.core.states": (*HEAVY[:-1], "hetero.v1"),
    "hetero.core.defaults": (*HEAVY[:-1], "hetero.v1"),
    "hetero.core.rankenv": (*HEAVY[:-1], "hetero.v1"),
    "hetero.core.yamlfields": (*HEAVY[:-1], "hetero.v1"),
    "hetero.core.replan": (*HEAVY, "hetero.v1"),
    # The gap breakdown: hetero-bench report reads it on machines without torch.
    "hetero.core.verdict": (*HEAVY, "hetero.v1", "hetero.trainer", "hetero.bench"),
    # The balancer: the trainer embeds it.
    "hetero.core.balancer": (*HEAVY, "hetero.v1", "hetero.bench"),
    # The pipeline partitioner: the trainer embeds it, as it does the balancer.
    "hetero.core.stages": (*HEAVY, "hetero.v1", "hetero.bench", "hetero.trainer"),
    "hetero.core.pipeplan": (*HEAVY, "hetero.v1", "hetero.bench", "hetero.trainer"),
}


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_an_entry_point_loads_only_what_it_uses(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"print(','.join(m for m in {ENTRY_POINTS[module]!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "", f"{module} loads {out.stdout.strip()}"


def test_the_import_contracts_hold() -> None:
    """pyproject.toml's [tool.importlinter] contracts, read over the checkout's ``hetero/``
    (which links every package folder) as ``make lint`` does."""
    pytest.importorskip("importlinter", reason="import-linter is in the dev extra")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command;"
            " sys.argv = ['lint-imports', '--no-cache']; sys.exit(lint_imports_command())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout
