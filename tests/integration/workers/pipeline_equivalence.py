"""Rank worker: a gpt2-tiny of 6 blocks as pipeline stages, cut unevenly, in one replica
or several with uneven shares of each global batch.

Usage: pipeline_equivalence.py OUT_PATH bounds=B0,B1,... schedule=gpipe|1f1b
       [shares=S0,S1,...] [resume=B0,B1,...] [model=gpt2|user]

``bounds``: the split (e.g. 0,4,6: two stages of 4 and 2 blocks); ``shares``: each
replica's samples of every global batch (default: one replica, all of it; ranks =
stages x replicas); ``resume``: the ranks stop after ``STEPS - 1`` steps, write the
checkpoint (``torch.distributed.checkpoint``, as a job does), and resume the last step
on a model cut at these bounds instead; ``model=user``: a model of one's own
(:class:`Mine`: its own embedding, blocks and output layer tied to the embedding), cut by
torch's tracer instead of the built-in model's parts.

Every rank trains its stage for ``STEPS`` SGD steps over the same global batches; the
last stage of each replica saves its replica's step losses, and every rank its stage's
parameters under the model's own names, to ``OUT_PATH.rank<r>``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hetero.core.pipeplan import Layout
from hetero.core.stages import Schedule
from hetero.trainer.models.transformer import build_transformer
from hetero.trainer.pipeline import Pipe, build, lm_loss
from hetero.trainer.shardstate import load_shards, save_shards

STEPS = 3
GLOBAL_BATCH = 8
MICROBATCH = 2
SEQ_LEN = 16
LAYERS = 6


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.out = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(torch.relu(self.fc(self.norm(x))))


class Mine(nn.Module):
    """A user's language model: nothing of hetero's in it."""

    def __init__(self, vocab: int = 256, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) * 2.0
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


KIND = "gpt2"


def model() -> nn.Module:
    torch.manual_seed(0)
    if KIND == "user":
        return Mine()
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


def reference(kind: str = "gpt2") -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process over each whole global batch."""
    global KIND
    KIND = kind
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
    out = argv[0]
    opts = dict(a.split("=", 1) for a in argv[1:])
    global KIND
    KIND = opts.get("model", "gpt2")
    bounds = [int(b) for b in opts["bounds"].split(",")]
    shares = [int(s) for s in opts.get("shares", str(GLOBAL_BATCH)).split(",")]
    dist.init_process_group("gloo")
    layout = Layout(len(bounds) - 1, dist.get_world_size())
    assert layout.replicas == len(shares) and sum(shares) == GLOBAL_BATCH
    replica = layout.replica_of(dist.get_rank())
    start = sum(shares[:replica])
    schedule = Schedule(opts["schedule"])
    example = batch(0)[0][:MICROBATCH]
    pipe = build(model(), bounds, MICROBATCH, layout=layout, schedule=schedule, example=example)
    opt = optimizer(pipe.module.parameters())
    losses = []
    for step in range(STEPS):
        if step == STEPS - 1 and "resume" in opts:
            resumed = [int(b) for b in opts["resume"].split(",")]
            pipe, opt = resume(Path(f"{out}.shards"), pipe, opt, resumed, layout, schedule)
        x, y = batch(step)
        opt.zero_grad()
        loss = pipe.step(
            x[start : start + shares[replica]], y[start : start + shares[replica]], GLOBAL_BATCH
        )
        opt.step()
        if loss is not None:
            losses.append(float(loss))
    params = {k.removeprefix("model."): v.detach() for k, v in pipe.module.state_dict().items()}
    torch.save({"losses": losses, "params": params}, f"{out}.rank{dist.get_rank()}")
    dist.destroy_process_group()


def resume(
    path: Path,
    pipe: Pipe,
    opt: torch.optim.Optimizer,
    bounds: list[int],
    layout: Layout,
    schedule: Schedule,
) -> tuple[Pipe, torch.optim.Optimizer]:
    """Checkpoint through files, as a job would, and load onto a pipeline cut at ``bounds``."""
    save_shards(path, pipe.module, opt, by_name=True)
    dist.barrier()
    example = batch(0)[0][:MICROBATCH]
    moved = build(model(), bounds, MICROBATCH, layout=layout, schedule=schedule, example=example)
    moved_opt = optimizer(moved.module.parameters())
    load_shards(path, moved.module, moved_opt, by_name=True)
    return moved, moved_opt


if __name__ == "__main__":
    main(sys.argv[1:])
