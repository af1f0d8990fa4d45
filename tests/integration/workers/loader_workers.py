"""Rank worker: DataLoader workers scaled to each rank's share while plans change.

Usage: loader_workers.py OUT_PREFIX SCALE
  SCALE  1: worker counts follow the plan (the default); 0: scale_workers=False

Three ranks on one host, ``num_workers=1`` (a node budget of 3), plans set by hand
at steps 0, 5 and 9 over 10 steps of 24 samples from 96: two and a half epochs.
Each sample carries its index and the worker count of the DataLoader that loaded
it. Every rank saves, per step, the indices it got and that count, and its
loader's ``worker_counts``.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from hetero import trainer as ht

STEPS = 10
GLOBAL_BATCH = 24
SAMPLES = 96


class Indexed(Dataset[tuple[torch.Tensor, torch.Tensor, int, int]]):
    """Sample ``i``: a feature vector, a label, ``i`` and the loading DataLoader's workers."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        info = get_worker_info()
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.tensor(i % 3), i, info.num_workers if info else 0


def main(argv: list[str]) -> None:
    prefix, scale = argv[0], argv[1] == "1"
    torch.manual_seed(0)
    ctx = ht.init("equal", rebalance_interval=3, warmup_steps=0)
    model = ctx.wrap(nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ctx.loader(Indexed(), GLOBAL_BATCH, seed=3, num_workers=1, scale_workers=scale)
    ctx.set_plan((14, 7, 3), 0)
    ctx.set_plan((2, 5, 17), 5)
    ctx.set_plan((1, 22, 1), 9)
    steps: list[tuple[int, list[int], list[int]]] = []
    while ctx.global_step < STEPS:
        for x, y, index, workers in loader:
            steps.append((ctx.global_step, index.tolist(), workers.tolist()))
            ctx.backward(nn.functional.cross_entropy(model(x), y))
            opt.step()
            opt.zero_grad()
            ctx.step()
            if ctx.global_step >= STEPS:
                break
    torch.save(
        {"steps": steps, "worker_counts": loader.worker_counts, "peers": ctx.local_peers},
        f"{prefix}.rank{ctx.rank}",
    )
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1:])
