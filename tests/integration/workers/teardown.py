"""Rank worker: run hetero-train's job or the plain-DDP baseline in this process, then
exit 3 if any thread of the process group outlived the run (they must end before the
interpreter finalizes: see ``hetero.trainer.procgroup``).

Usage: teardown.py (train | baseline) ARGS...   (ARGS: that entry point's own flags)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Names torch 2.x gives the Gloo workers, Gloo's TCP loop and the TCPStore server.
GROUP_THREADS = ("pt_gloo", "gloo_", "pt_tcpstore")


def group_threads() -> list[str]:
    """This process's threads that belong to a process group (Linux thread names)."""
    tasks = Path("/proc/self/task")
    names = [(tasks / tid / "comm").read_text().strip() for tid in os.listdir(tasks)]
    return sorted(n for n in names if n.startswith(GROUP_THREADS))


def main(argv: list[str]) -> int:
    which, argv = argv[0], argv[1:]
    if which == "train":
        from hetero.trainer.cli import main as run
    else:
        from hetero.bench.baseline_ddp import main as run
    code = run(argv)
    alive = group_threads()
    if alive:
        print(f"process group threads alive after the run: {alive}", file=sys.stderr)
        return 3
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
