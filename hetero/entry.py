"""The console scripts: each command's ``main``, imported only when the command runs,
so a Python package missing from the environment is one ``error:`` line, not a
traceback.

A command's module imports its libraries (SQLAlchemy, gRPC, Textual, torch) at
import time, before its ``main`` could catch anything: installed with
``--no-deps``, or run by an interpreter other than the one hetero was installed
into, ``hetero-coord`` used to die with a ``ModuleNotFoundError`` traceback. Here
the import and the run are inside one ``try``; a module missing while a command
runs (one it imports lazily, like ``hetero-bench``'s torch) gets the same line.
A module that comes with one of hetero's extras (torch: ``hetero[train]``) is named
with the extra that brings it.

A reader that stops early (``hetero-coord logs JOB | head``) closes the pipe under the
command: its next write raises ``BrokenPipeError``. That is the reader's choice, not an
error: the command ends quietly with status 141, as one a SIGPIPE ended does, and its
standard output goes to ``/dev/null`` so the interpreter's last flush at exit cannot
raise it again.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

#: Libraries that come with one of hetero's extras, not with hetero itself: the extra.
EXTRAS = {"torch": "train", "torchvision": "train"}


def _run(command: str, module: str) -> int:
    try:
        main: Callable[[], int] = importlib.import_module(module).main
        return main()
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        extra = EXTRAS.get(missing.partition(".")[0])
        fix = (
            f"install hetero[{extra}] (pip install 'hetero[{extra}]')"
            if extra
            else "install hetero with its dependencies into this interpreter"
        )
        print(
            f"error: {command} needs the Python module {missing!r}, which {sys.executable} "
            f"cannot import: {fix}",
            file=sys.stderr,
        )
        return 1
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # SIGPIPE's status


def coord() -> int:
    return _run("hetero-coord", "hetero.coordinator.cli")


def agent() -> int:
    return _run("hetero-agent", "hetero.agent.cli")


def train() -> int:
    return _run("hetero-train", "hetero.trainer.cli")


def bench() -> int:
    return _run("hetero-bench", "hetero.bench.cli")


def top() -> int:
    return _run("hetero-top", "hetero.tui.cli")
