"""Rank worker: run hetero-train's job, the plain-DDP baseline or a custom loop in this
process, then exit 3 if any thread of the process group outlived the run (they must
end before the interpreter finalizes: see ``hetero.trainer.procgroup``).

Usage: teardown.py (train | baseline) ARGS...   (ARGS: that entry point's own flags)
       teardown.py loop SHARD                   (SHARD: ctx.wrap's shard)

``loop`` trains as ``examples/custom_loop.py`` does: ``ctx.close()`` while the
model is still alive, the model dropped when the loop's function returns. Its
threads are checked at the last moment the interpreter is whole, the last
``atexit`` callback (registered first).
"""

from __future__ import annotations

import atexit
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


def report(alive: list[str]) -> None:
    print(f"process group threads alive after the run: {alive}", file=sys.stderr)


def custom_loop(shard: str) -> int:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from hetero import trainer as ht

    torch.manual_seed(0)
    x = torch.randn(64, 8)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    ctx = ht.init("dynamic", rebalance_interval=2, device="cpu")
    model = ctx.wrap(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)), shard=shard)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for xb, yb in ctx.loader(data, global_batch=8):
        ctx.backward(nn.functional.mse_loss(model(xb), yb))
        optimizer.step()
        optimizer.zero_grad()
        ctx.step()
        if ctx.global_step >= 4:
            break
    ctx.close()
    return 0


def check_at_exit() -> None:
    alive = group_threads()
    if alive:
        report(alive)
        sys.stderr.flush()
        os._exit(3)


def main(argv: list[str]) -> int:
    which, argv = argv[0], argv[1:]
    if which == "loop":
        atexit.register(check_at_exit)
        return custom_loop(argv[0])
    if which == "train":
        from hetero.trainer.cli import main as run
    else:
        from hetero.bench.baseline_ddp import main as run
    code = run(argv)
    alive = group_threads()
    if alive:
        report(alive)
        return 3
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
