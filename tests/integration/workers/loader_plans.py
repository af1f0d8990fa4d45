"""Rank worker: the plan moves at every boundary while one DataLoader's workers load on.

Usage: loader_plans.py OUT_PREFIX

Two ranks, 2 DataLoader workers each, a policy that moves to the next plan of a cycle
at every boundary (every 12 steps; each move applies once the loaders' lookahead has
been handed out), 60 steps of 16 samples from 96: ten epochs, four plan changes. A
sample costs 1 ms to load and a step ~20 ms of compute (a sleep in backward), so the
workers keep up. Each sample carries its index and the pid of the process that loaded
it. Every rank saves, per step, the plan that ran, its indices and those pids; its own
pid; and its summaries; its metrics go to ``OUT_PREFIX.out/metrics``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict

import torch
from torch import nn
from torch.utils.data import Dataset

from hetero import trainer as ht
from hetero.core.balancer import Decision, equal_batches
from hetero.trainer.exchange import EmbeddedPlanner

STEPS = 60
GLOBAL_BATCH = 16
SAMPLES = 96
LOAD_S = 0.001
COMPUTE_S = 0.02
CYCLE = ((12, 4), (4, 12), (10, 6), (6, 10))


class Cycling:
    """Equal at first, then the plan after the current one in ``CYCLE``, at every boundary."""

    name = "cycling"

    def initial(self, constraints, profiles=None):  # type: ignore[no-untyped-def]
        return equal_batches(constraints)

    def next_plan(self, history, current, constraints, profiles=None, horizon=None):  # type: ignore[no-untyped-def]
        at = CYCLE.index(tuple(current)) + 1 if tuple(current) in CYCLE else 0
        return Decision(CYCLE[at % len(CYCLE)], True, "next in the cycle")


class Indexed(Dataset[tuple[torch.Tensor, torch.Tensor, int, int]]):
    """Sample ``i``: features, a label, ``i`` and the pid of the process that loaded it."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        time.sleep(LOAD_S)
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.tensor(i % 3), i, os.getpid()


def main(argv: list[str]) -> None:
    prefix = argv[0]
    torch.manual_seed(0)
    ctx = ht.init("equal", rebalance_interval=12, comm="deferred", output_dir=f"{prefix}.out")
    model = ctx.wrap(nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ctx.loader(Indexed(), GLOBAL_BATCH, seed=3, num_workers=2)
    assert isinstance(ctx.planner, EmbeddedPlanner)
    ctx.planner = EmbeddedPlanner(Cycling(), ctx.planner.constraints)
    steps: list[tuple[int, tuple[int, ...], list[int], list[int]]] = []
    while ctx.global_step < STEPS:
        for x, y, index, pid in loader:
            steps.append((ctx.global_step, ctx.running_plan, index.tolist(), pid.tolist()))
            loss = nn.functional.cross_entropy(model(x), y)
            time.sleep(COMPUTE_S)
            ctx.backward(loss)
            opt.step()
            opt.zero_grad()
            ctx.step()
            if ctx.global_step >= STEPS:
                break
    torch.save(
        {
            "steps": steps,
            "pid": os.getpid(),
            "summaries": [[asdict(s) for s in interval] for interval in ctx.summaries],
        },
        f"{prefix}.rank{ctx.rank}",
    )
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1:])
