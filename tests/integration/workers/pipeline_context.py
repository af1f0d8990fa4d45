"""Rank worker: a training loop of the trainer API with ``ctx.wrap(model, pipeline=2)``.

Usage: pipeline_context.py OUT_PATH

4 ranks: 2 replicas of a 2-stage gpt2-tiny of 6 blocks. The replicas are given 12 and 4
of each global batch of 16 (``ctx.set_plan``); the loop trains ``STEPS`` SGD steps, and
after ``RECUT_AT`` steps writes a checkpoint and re-cuts the stages if that pays: stage 1
of both replicas runs EMULATED 4x slower from step 1 on, so the even split it started
with no longer holds. Each rank saves to ``OUT_PATH.rank<r>`` its replica's
losses (on its last stage), the plan that ran, the splits and its parameters.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

import hetero.trainer as ht
from hetero.core.balancer import Horizon
from hetero.trainer.checkpoint import save_checkpoint
from hetero.trainer.models.transformer import GPT, BertMLM, build_transformer
from hetero.trainer.pipeline import lm_loss
from hetero.trainer.pipeline.recut import recut_if_it_pays
from hetero.trainer.sampler import epoch_permutation
from hetero.trainer.shardstate import shards_dir

STEPS = 6
RECUT_AT = 3
GLOBAL_BATCH = 16
SAMPLES = 128
SEQ_LEN = 16
LAYERS = 6
PLAN = (12, 4)


def model() -> GPT | BertMLM:
    torch.manual_seed(0)
    return build_transformer("gpt2-tiny", max_seq_len=SEQ_LEN, n_layers=LAYERS)


def optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


class Windows(torch.utils.data.Dataset[Any]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, 256, (SAMPLES, SEQ_LEN + 1), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[i, :-1], self.ids[i, 1:]


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process over the same global batches (the loader's seeded order)."""
    m, data = model(), Windows()
    opt = optimizer(m)
    order = epoch_permutation(SAMPLES, 0, 0)
    losses = []
    for step in range(STEPS):
        idx = order[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH]
        x, y = data.ids[idx, :-1], data.ids[idx, 1:]
        loss = lm_loss(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in m.state_dict().items()}


def main(out: str) -> None:
    ctx = ht.init(
        "equal",
        rebalance_interval=100,
        device="cpu",
        emulate_slowdown="1:4@1-,3:4@1-",
        output_dir=str(Path(out).parent / "run"),
    )
    wrapped = ctx.wrap(model(), pipeline=2, split=(0, 3, 6))  # even: a timing-free start
    opt = optimizer(wrapped)
    loader = ctx.loader(Windows(), GLOBAL_BATCH)
    ctx.set_plan(PLAN, 0)
    splits = [ctx.pipeline.pipe.bounds]
    losses, moves = [], []
    for x, y in loader:
        loss = wrapped.step(x, y)
        opt.step()
        opt.zero_grad()
        ctx.step(loss)
        if loss is not None:
            losses.append(float(loss))
        if ctx.global_step == RECUT_AT:
            path = Path(out).parent / "ckpt" / "last.pt"
            save_checkpoint(path, ctx, wrapped, opt)
            moved = recut_if_it_pays(
                ctx,
                shards_dir(path, ctx.global_step),
                model,
                optimizer,
                horizon=Horizon(RECUT_AT, STEPS - RECUT_AT),
                move_s=0.0,
            )
            if moved is not None:
                wrapped, opt, move = moved
                moves.append(move.reason)
                splits.append(ctx.pipeline.pipe.bounds)
        if ctx.global_step >= STEPS:
            break
    params = {k.removeprefix("stage.model."): v.detach() for k, v in wrapped.state_dict().items()}
    torch.save(
        {
            "losses": losses,
            "plan": list(ctx.running_plan),
            "splits": splits,
            "moves": moves,
            "params": params,
        },
        f"{out}.rank{ctx.rank}",
    )
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1])
