"""Rank worker: rank 1 is slowed by 50 ms per step; each rank saves its step timings.

Usage: timing.py OUT_PREFIX [WHERE]
  backward  (default) inside backward, like a slow device
  input     in loading its batch (a DataLoader whose dataset is slow on rank 1)
  input-bn  the same, the model with a BatchNorm (DDP broadcasts its buffers each step)
  shard     inside backward, the model sharded with FSDP2 (shard=full)
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict

import torch
from torch import nn
from torch.utils.data import Dataset

from hetero import trainer as ht
from hetero.trainer.datasets import SyntheticImages
from hetero.trainer.models.vision import DebugNet

SLOW_S = 0.05


class SleepInBackward(torch.autograd.Function):
    """Identity forward; backward sleeps first, like a slow device computing gradients."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        time.sleep(SLOW_S)
        return grad


class Slowed(nn.Module):
    def __init__(self, inner: nn.Module, slow: bool) -> None:
        super().__init__()
        self.inner = inner
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # On the output, the sleep is the first thing backward runs: every
        # gradient bucket is late by SLOW_S, as on a device that computes slowly.
        out = self.inner(x)
        return SleepInBackward.apply(out) if self.slow else out


class SlowItems(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The samples without ``get_batch`` (the DataLoader path); each costs ``delay_s``."""

    def __init__(self, inner: SyntheticImages, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        return self.inner[i]


def main(argv: list[str]) -> None:
    prefix = argv[0]
    where = argv[1] if len(argv) > 1 else "backward"
    torch.manual_seed(0)
    ctx = ht.init("equal", rebalance_interval=10, warmup_steps=2)
    slow = ctx.rank == 1
    inner: nn.Module = DebugNet(10, 8)
    if where == "input-bn":
        inner = nn.Sequential(nn.BatchNorm2d(3), inner)
    slowed = Slowed(inner, slow=slow and where in ("backward", "shard"))
    model = ctx.wrap(slowed, shard="full" if where == "shard" else "none")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = SyntheticImages(512, 8, 10)
    if where.startswith("input"):  # 16 samples per rank: 50 ms per batch on rank 1
        loader = ctx.loader(SlowItems(data, SLOW_S / 16 if slow else 0.0), 32)
    else:
        loader = ctx.loader(data, 32)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in loader:
        loss = loss_fn(model(x), y)
        ctx.backward(loss)
        opt.step()
        opt.zero_grad()
        ctx.step()
        if ctx.global_step >= 10:
            break
    torch.save([asdict(s) for s in ctx.summaries[-1]], f"{prefix}.rank{ctx.rank}")
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1:])
