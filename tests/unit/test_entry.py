"""The console scripts (``hetero.entry``): a Python module missing from the environment
is one ``error:`` line and exit 1, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

COMMANDS = {
    "hetero-coord": "coord",
    "hetero-agent": "agent",
    "hetero-train": "train",
    "hetero-bench": "bench",
    "hetero-top": "top",
}


def test_every_command_is_installed_through_the_entry_module() -> None:
    installed = {e.name: e.value for e in entry_points(group="console_scripts")}
    for command, function in COMMANDS.items():
        assert installed[command] == f"hetero.entry:{function}"


def _run_without(module: str, function: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``hetero.entry.<function>`` in a fresh interpreter where ``module`` cannot be
    imported (``None`` in ``sys.modules`` makes every import of it fail)."""
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None\n"
        f"sys.argv = {['hetero', *argv]!r}\n"
        "from hetero import entry\n"
        f"sys.exit(entry.{function}())\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("command", "missing", "argv"),
    [
        ("hetero-coord", "sqlalchemy", ("jobs",)),
        ("hetero-top", "textual", ("--coordinator", "127.0.0.1:9")),
        ("hetero-top", "grpc", ("--help",)),
        ("hetero-agent", "grpc", ("--help",)),
    ],
)
def test_a_missing_dependency_is_one_line_naming_it(
    command: str, missing: str, argv: tuple[str, ...]
) -> None:
    result = _run_without(missing, COMMANDS[command], *argv)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {command} needs the Python module '{missing}'")
    assert sys.executable in line


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        # Before any rank starts: the launcher's check, not one traceback per rank.
        ("hetero-train", ("--nproc", "2", "--device", "cpu", "--steps", "2")),
        ("hetero-train", ("--steps", "2")),
        # A CPU scenario, whose runs all train (--dry-run needs no torch).
        ("hetero-bench", ("run", "cpu-emulated", "--out", "{tmp}")),
    ],
)
def test_a_missing_torch_names_the_extra_that_brings_it(
    command: str, argv: tuple[str, ...], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = _run_without("torch", COMMANDS[command], *(a.format(tmp=out) for a in argv))
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {command} needs the Python module 'torch'")
    assert line.endswith("install hetero[train] (pip install 'hetero[train]')")
    assert not out.exists(), "nothing of the benchmark was started"


def test_a_command_runs_its_main_when_everything_is_there() -> None:
    result = _run_without("no_such_module_anywhere", "coord", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: hetero-coord" in result.stdout


def test_a_reader_that_stops_early_ends_the_command_quietly() -> None:
    """``hetero-coord logs JOB | head`` ended in a BrokenPipeError traceback (issue #34):
    the reader closed the pipe, which is no error of the command's."""
    code = (
        "import sys; from hetero import entry; from hetero.coordinator import cli\n"
        "def main() -> int:\n"
        "    for i in range(100000):\n"
        "        print('line', i)\n"
        "    return 0\n"
        "cli.main = main\n"
        "sys.exit(entry.coord())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "line 0\n"
    proc.stdout.close()  # as head does after its lines
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and err == "", err
