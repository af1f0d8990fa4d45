"""Rank worker: a custom loop, shaped as ``examples/custom_loop.py``, whose own model (a
run of residual blocks with BatchNorm, and no checkpointing switch) goes through
``ctx.wrap`` and ``ctx.probe_memory`` under ``activation_checkpointing`` MODE.

Usage: user_recompute.py OUT MODE SHARD INJECT

INJECT is ``HETERO_PROBE_MEMORY``'s value for this job (``-``: unset), so that jobs
run in turn (``in_turn.py``) can differ in it. Rank 0 writes OUT (JSON): the global mean loss of every step, the run's summary
``recompute`` field, the last plan and the final state dict (parameters and
BatchNorm's running statistics, as lists).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from hetero import trainer as ht
from hetero.trainer.memprobe import INJECT_ENV


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.bn(self.fc(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.blocks = nn.Sequential(*[Block() for _ in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def main(argv: list[str]) -> int:
    out, mode, shard, inject = Path(argv[0]), argv[1], argv[2], argv[3]
    os.environ.pop(INJECT_ENV, None)
    if inject != "-":
        os.environ[INJECT_ENV] = inject
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(480, 8, generator=g), torch.randint(0, 4, (480,), generator=g))
    ctx = ht.init("equal", device="cpu", min_batch=2, activation_checkpointing=mode)
    model = ctx.wrap(Net(), shard=shard)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = ctx.loader(data, global_batch=48)
    loss_fn = nn.functional.cross_entropy
    ctx.probe_memory(model, optimizer, lambda b: loss_fn(model(b[0]), b[1]))
    losses: list[float] = []
    for x, y in loader:
        loss = loss_fn(model(x), y)
        ctx.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        total = torch.tensor([loss.item() * len(x), float(len(x))], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(float(total[0] / total[1]))
        ctx.step()
        if ctx.global_step >= 6:
            break
    summary = ctx.report(print_table=False)
    state = model.state_dict()
    if shard != "none":
        from hetero.trainer.sharding import full_weights

        state = full_weights(model)
    if ctx.rank == 0:
        result = {
            "losses": losses,
            "recompute": summary["recompute"],
            "plan": list(ctx.plan),
            "state": {k: v.float().flatten().tolist() for k, v in state.items()},
        }
        out.write_text(json.dumps(result))
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
