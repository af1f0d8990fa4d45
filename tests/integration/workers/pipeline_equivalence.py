"""Rank worker: a gpt2-tiny of 6 blocks as one pipeline stage a rank, cut unevenly.

Usage: pipeline_equivalence.py OUT_PATH BOUNDS SCHEDULE [RESUME_BOUNDS]   (BOUNDS: e.g.
0,4,6; SCHEDULE: gpipe | 1f1b)

With ``RESUME_BOUNDS`` the ranks stop after ``STEPS - 1`` steps, write their shares of the
checkpoint, and resume the last step on a model cut at ``RESUME_BOUNDS`` instead.

Every rank trains its stage for ``STEPS`` SGD steps over the same global batches; the
last stage saves the step losses, and every rank its stage's parameters under the
model's own names, to ``OUT_PATH.rank<r>``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

from hetero.core.stages import Schedule
from hetero.trainer.models.transformer import GPT, BertMLM, build_transformer
from hetero.trainer.pipeline import Pipe, build, lm_loss, load_stage_state, stage_state

STEPS = 3
GLOBAL_BATCH = 8
MICROBATCHES = 4
SEQ_LEN = 16
LAYERS = 6


def model() -> GPT | BertMLM:
    torch.manual_seed(0)
    return build_transformer("gpt2-tiny", max_seq_len=SEQ_LEN, n_layers=LAYERS)


def optimizer(params: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    # SGD, linear in the gradient: the parameters differ from one process's by the
    # gradients' rounding alone. (AdamW's g/sqrt(v) turns a rounding difference in a
    # near-zero gradient into a step of a sizeable share of lr.)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, 256, (GLOBAL_BATCH, SEQ_LEN + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process over each whole global batch."""
    m = model()
    opt = optimizer(m.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = lm_loss(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in m.state_dict().items()}


def main(argv: list[str]) -> None:
    out, bounds, schedule = argv[0], [int(b) for b in argv[1].split(",")], Schedule(argv[2])
    dist.init_process_group("gloo")
    pipe = build(model(), bounds, MICROBATCHES, schedule=schedule)
    opt = optimizer(pipe.stage.parameters())
    losses = []
    for step in range(STEPS):
        if step == STEPS - 1 and len(argv) > 3:
            pipe, opt = resume(f"{out}.share", pipe, opt, [int(b) for b in argv[3].split(",")])
        opt.zero_grad()
        loss = pipe.step(*batch(step))
        opt.step()
        if loss is not None:
            losses.append(loss)
    params = {k.removeprefix("model."): v.detach() for k, v in pipe.stage.state_dict().items()}
    torch.save({"losses": losses, "params": params}, f"{out}.rank{dist.get_rank()}")
    dist.destroy_process_group()


def resume(
    path: str, pipe: Pipe, opt: torch.optim.Optimizer, bounds: list[int]
) -> tuple[Pipe, torch.optim.Optimizer]:
    """Checkpoint through files, as a job would, and load onto a pipeline cut at ``bounds``."""
    torch.save(stage_state(pipe, opt), f"{path}{dist.get_rank()}")
    dist.barrier()
    shares = [torch.load(f"{path}{r}") for r in range(dist.get_world_size())]
    moved = build(model(), bounds, MICROBATCHES, schedule=Schedule.ONE_F_ONE_B)
    moved_opt = optimizer(moved.stage.parameters())
    load_stage_state(moved, moved_opt, shares)
    return moved, moved_opt


if __name__ == "__main__":
    main(sys.argv[1:])
