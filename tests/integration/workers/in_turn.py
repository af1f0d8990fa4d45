"""Rank runner: several worker jobs one after another in the same rank processes.

Usage: in_turn.py STATE_DIR -- SCRIPT ARGS... [-- SCRIPT ARGS...]...

Each SCRIPT is a worker of this folder with ``main(argv)``; every rank runs them in the
order given, each a whole job of its own (``ht.init`` ... ``ctx.close()``). A rank
process costs seconds of CPU before its first step (importing torch, and torch._dynamo
through DDP and the optimizers); jobs run in turn pay it once.

Each job rendezvouses on a port of its own: the group of the job before may still be
ending on another rank (its store server among it), and a rank that joined the next
job on the same port could reach that store. Rank 0 picks the next port once its own
job has returned and writes it to ``STATE_DIR/port.<k>``; the others wait for that
file. A group that outlives its job (an FSDP2 job's device mesh holds it) is left
alone: the next job's group is another, on another port, and the old one ends with the
process, as it would have alone.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

from hetero.core.rankenv import MASTER_PORT, RANK
from hetero.trainer.launch import free_port

HERE = Path(__file__).parent
#: How long a rank waits for rank 0 to hand over the next job's port (seconds).
HANDOVER_TIMEOUT_S = 120.0


def jobs(argv: list[str]) -> list[list[str]]:
    """``-- a x -- b y`` as ``[["a", "x"], ["b", "y"]]``."""
    if not argv or argv[0] != "--":
        raise SystemExit("usage: in_turn.py STATE_DIR -- SCRIPT ARGS... [-- SCRIPT ARGS...]")
    out: list[list[str]] = []
    for word in argv:
        if word == "--":
            out.append([])
        else:
            out[-1].append(word)
    if any(not job for job in out):
        raise SystemExit("in_turn.py: an empty job between two --")
    return out


def worker(script: str) -> ModuleType:
    """The worker ``script`` of this folder, imported."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, HERE / script)
    assert spec and spec.loader, script
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hand_over(state: Path, k: int, rank: int) -> None:
    """Rendezvous job ``k`` (k >= 1) on the port rank 0 chose for it."""
    path = state / f"port.{k}"
    if rank == 0:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(free_port()))
        tmp.rename(path)  # atomic: a reader sees the whole port or no file
    deadline = time.monotonic() + HANDOVER_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: no port for job {k} after {HANDOVER_TIMEOUT_S:.0f} s")
        time.sleep(0.01)
    os.environ[MASTER_PORT] = path.read_text()


def main(argv: list[str]) -> int:
    state = Path(argv[0])
    state.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ[RANK])
    for k, (script, *args) in enumerate(jobs(argv[1:])):
        if k:
            hand_over(state, k, rank)
        code = worker(script).main(args)
        gc.collect()  # the job's model may sit in a reference cycle; its group with it
        if code:
            return int(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
