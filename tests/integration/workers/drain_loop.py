"""Rank worker: a user's loop that stops on SIGTERM through the ctx API, and resumes.

Usage: drain_loop.py OUT PHASE SHARD
  PHASE full    train STEPS steps
        stop    rank 0 sends itself SIGTERM after step SIGNAL_AT; the loop checkpoints
                (``save_checkpoint``) when ``ctx.stopping`` says all ranks agreed, and ends
        resume  resume from the checkpoint ``stop`` wrote and train to STEPS
  SHARD  none or full (FSDP2)

Rank 0 writes ``OUT`` = {"losses": {step: rank 0's loss}, "stopped_at": step or None};
every rank writes ``OUT.rank<r>`` = the step it stopped at (None if it did not).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

from hetero import trainer as ht
from hetero.trainer import drain
from hetero.trainer.checkpoint import load_checkpoint, save_checkpoint
from hetero.trainer.datasets import SyntheticImages
from hetero.trainer.models.vision import DebugNet

STEPS = 16
SIGNAL_AT = 7  # the stop then falls inside an interval (rebalance_interval 4)
GLOBAL_BATCH = 24


def main(argv: list[str]) -> int:
    out, phase, shard = Path(argv[0]), argv[1], argv[2]
    checkpoint = out.parent / f"drain-{shard}.pt"
    # Poll every step, whatever the pace: the agreed step is then exactly two after the signal.
    drain.POLL_PERIOD_S = 0.0
    torch.manual_seed(0)
    ctx = ht.init("equal", rebalance_interval=4, warmup_steps=0)
    model = ctx.wrap(DebugNet(num_classes=10, image_size=8), shard=shard)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    loader = ctx.loader(SyntheticImages(240, 8, 10, seed=1), GLOBAL_BATCH, seed=5)
    if phase == "resume":
        load_checkpoint(checkpoint, ctx, model, opt)
    ctx.stop_on_sigterm()
    loss_fn = nn.CrossEntropyLoss()
    losses: dict[int, float] = {}
    stopped_at = None
    while ctx.global_step < STEPS and stopped_at is None:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            ctx.backward(loss)
            opt.step()
            opt.zero_grad()
            ctx.step()
            losses[ctx.global_step] = loss.item()
            if phase == "stop" and ctx.rank == 0 and ctx.global_step == SIGNAL_AT:
                os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler's stop does
            if ctx.stopping:
                save_checkpoint(checkpoint, ctx, model, opt)
                stopped_at = ctx.global_step
                break
            if ctx.global_step >= STEPS:
                break
    torch.save(stopped_at, f"{out}.rank{ctx.rank}")
    if ctx.rank == 0:
        torch.save({"losses": losses, "stopped_at": stopped_at}, out)
    del model
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
