"""Rank worker: gpt2-tiny, uneven changing plans, optionally injected out-of-memory errors.

Usage: lm_equivalence.py OUT_PATH MODE   (MODE: plain | oom)

In ``oom`` mode ranks run out of memory (injected) in backward and in forward
at given steps; the guard retries those steps with the same samples. Rank 0
saves the parameters, the plans and the retry events; every rank saves its
per-step batch sizes.
"""

from __future__ import annotations

import sys

import torch

from hetero import trainer as ht
from hetero.trainer.datasets.text import CausalLMSamples, SyntheticText
from hetero.trainer.memory import MemoryMonitor
from hetero.trainer.models.transformer import build_transformer
from hetero.trainer.oom import OomGuard
from hetero.trainer.tasks import make_task

STEPS = 10
GLOBAL_BATCH = 24
SEQ_LEN = 16
#: Ranks 0 (in forward) and 1 (late in backward, most buckets already sent) fail
#: together at step 3; rank 2 fails in forward at step 6.
INJECT = "0:3:forward,1:3:backward,2:6:forward"


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_transformer("gpt2-tiny", max_seq_len=SEQ_LEN)


def dataset() -> CausalLMSamples:
    return CausalLMSamples(SyntheticText(480, SEQ_LEN, 256, seed=3))


def main(argv: list[str]) -> None:
    out, mode = argv[0], argv[1]
    ctx = ht.init("equal", rebalance_interval=4, warmup_steps=0)
    # Small buckets: several all-reduces per backward, so a failure mid-backward
    # leaves some buckets sent and some not.
    model = ctx.wrap(build(), bucket_cap_mb=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = ctx.loader(dataset(), GLOBAL_BATCH, seed=5)
    ctx.set_plan((12, 8, 4), 0)
    ctx.set_plan((3, 9, 12), 5)
    task = make_task("causal-lm")
    monitor = MemoryMonitor(ctx, measure=False)
    guard = OomGuard(ctx, model, monitor, inject=INJECT if mode == "oom" else "")

    def compute(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        loss = task.loss(model(x), y)
        ctx.backward(loss)
        return loss

    sizes = []
    while ctx.global_step < STEPS:
        for batch in loader:
            batch, loss = guard.run(batch, compute)
            sizes.append(batch[0].shape[0])
            opt.step()
            opt.zero_grad(set_to_none=True)
            ctx.step(loss)
            monitor.after_step(batch[0].shape[0])
            if ctx.global_step >= STEPS:
                break
    if ctx.rank == 0:
        torch.save(
            {
                "params": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
                "plans": [p.batches for p in ctx.plans],
                "events": [(e.step, e.failed, e.plan) for e in guard.events],
            },
            out,
        )
    torch.save(sizes, f"{out}.rank{ctx.rank}.sizes")
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1:])
