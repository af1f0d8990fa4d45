"""Rank worker: K optimizer steps with uneven, changing plans; rank 0 saves the parameters.

Usage: equivalence.py OUT_PATH MODE   (MODE: scripted | dynamic | syncbn | plainbackward)
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from hetero import trainer as ht
from hetero.trainer.datasets import SyntheticImages
from hetero.trainer.models.vision import DebugNet

STEPS = 12
GLOBAL_BATCH = 24


class BNNet(nn.Module):
    """DebugNet with a BatchNorm: per-rank statistics unless converted to SyncBatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


def build(mode: str) -> nn.Module:
    torch.manual_seed(0)
    return BNNet() if mode == "syncbn" else DebugNet(num_classes=10, image_size=8)


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    model = build(mode)
    ctx = ht.init(
        "dynamic" if mode == "dynamic" else "equal",
        rebalance_interval=3,
        emulate_slowdown="2:4" if mode == "dynamic" else None,
        warmup_steps=0,
    )
    ddp = ctx.wrap(model, sync_batchnorm=mode == "syncbn")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.9)
    loader = ctx.loader(SyntheticImages(240, 8, 10, seed=1), GLOBAL_BATCH, seed=5)
    if mode != "dynamic":
        # Identical calls on every rank: uneven from the start, changed mid-run twice.
        ctx.set_plan((14, 7, 3), 0)
        ctx.set_plan((2, 5, 17), 5)
        ctx.set_plan((1, 22, 1), 9)
    loss_fn = nn.CrossEntropyLoss()
    sizes = []
    while ctx.global_step < STEPS:
        for x, y in loader:
            sizes.append(x.shape[0])
            loss = loss_fn(ddp(x), y)
            if mode == "plainbackward":
                loss.backward()  # a loop that does not use ctx.backward
            else:
                ctx.backward(loss)
            opt.step()
            opt.zero_grad()
            ctx.step()
            if ctx.global_step >= STEPS:
                break
    if ctx.rank == 0:
        torch.save(
            {
                "params": {k: v.detach().clone() for k, v in ddp.module.state_dict().items()},
                "plans": [p.batches for p in ctx.plans],
            },
            out,
        )
    torch.save(sizes, f"{out}.rank{ctx.rank}.sizes")
    ctx.close()


if __name__ == "__main__":
    main()
