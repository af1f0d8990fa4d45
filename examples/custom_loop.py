"""A plain PyTorch training loop adopting hetero: the lines marked `# hetero` are all it takes.

Run it on 3 local CPU ranks, rank 2 emulated 3x slower:

    torchrun --nproc-per-node 3 examples/custom_loop.py --emulate-slowdown 2:3

or on 3 ranks of a Slurm allocation (one group; docs/trainer.md, "Under Slurm"):

    srun -n 3 python examples/custom_loop.py --emulate-slowdown 2:3

Without a launcher it runs as a single process. As a coordinator's `command:` job
(docs/jobspec.md) it takes the job file's global batch, steps and policy (`ctx.job`).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

from hetero import trainer as ht  # hetero


def make_data(n: int = 4096) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--emulate-slowdown", help="e.g. 2:3 (CPU only; emulated)")
    p.add_argument(
        "--output-dir", help="per-interval metrics go to DIR/metrics (hetero-top --run DIR)"
    )
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1))
    # Policy "dynamic" and a re-plan every 10 steps, or the job file's under a coordinator.
    ctx = ht.init(emulate_slowdown=args.emulate_slowdown, output_dir=args.output_dir)  # hetero
    model = ctx.wrap(model)  # hetero
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # Under a coordinator the job file's terms rule (ctx.job); alone, or under torchrun or
    # srun, the flags do.
    job = ctx.job
    steps = job.steps if job is not None and job.steps else args.steps
    loader = ctx.loader(make_data(), None if job else args.global_batch)  # hetero

    while ctx.global_step < steps:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            ctx.backward(loss)  # hetero: instead of loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            ctx.step()  # hetero
            if ctx.global_step >= steps:
                break

    if ctx.rank == 0:
        tag = " (emulated slowdown)" if ctx.emulated else ""
        print(
            f"done: {ctx.global_step} steps, final plan {list(ctx.plan)}{tag}, loss {loss.item():.4f}"
        )
    ctx.report()  # hetero: throughput and where it went, printed on rank 0
    ctx.close()


if __name__ == "__main__":
    main()
