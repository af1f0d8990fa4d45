"""Rank worker: K optimizer steps with uneven, changing plans; rank 0 saves the parameters.

Usage: equivalence.py OUT_PATH MODE
  scripted       plans set by hand: uneven from step 0, changed at steps 5 and 9; comm=auto,
                 which plans in deferred and switches to an overlap trial at step 9
  overlap        scripted, every all-reduce started as its bucket is ready
  deferred       scripted, every all-reduce started once the step's last bucket is ready
  dynamic        the dynamic policy, rank 2 emulated 30x slower (a gain no CPU noise hides:
                 at 8x the tiny model's all-reduce left a 20% gain a loaded host's
                 3-step intervals could not show)
  workers        dynamic, through a DataLoader with 2 worker processes (prefetching)
  plainbackward  scripted, but the loop calls loss.backward() itself
  recheck        a policy that moves at the first boundary and asks for a re-check after
                 one settled step, and moves again there, within the interval
  syncbn         scripted, with BatchNorm converted to SyncBatchNorm (CUDA ranks)
  bn             scripted, with BatchNorm left per rank (statistics over each rank's batch)
  shard-full     scripted, sharded with FSDP2 (shard=full: parameters re-gathered in backward)
  shard-plain    scripted, sharded with FSDP2 (shard=grad_op), the loop calling
                 loss.backward() itself
  shard-offload  shard-full with offload=params
  shard-dynamic  dynamic (rank 2 emulated 30x slower), sharded with FSDP2 (shard=full)
  recompute      scripted, rank 1 alone recomputing its activations in backward
  shard-recompute  shard-full, rank 1 alone recomputing its activations in backward

On 3 ranks the scripted plans are (14, 7, 3), (2, 5, 17) from step 5, (1, 22, 1) from
step 9; on 2 ranks (17, 7), (5, 19), (22, 2). TF32 is off so CUDA ranks compute in fp32.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import Dataset

from hetero import trainer as ht
from hetero.core.balancer import Decision, equal_batches
from hetero.trainer.datasets import SyntheticImages
from hetero.trainer.exchange import EmbeddedPlanner
from hetero.trainer.models.vision import DebugNet

STEPS = 12
GLOBAL_BATCH = 24
#: The modes whose plans come from the dynamic policy, not a script.
DYNAMIC = ("dynamic", "workers", "shard-dynamic")
#: The scripted plans by world size: (plan, first step).
PLANS = {
    3: (((14, 7, 3), 0), ((2, 5, 17), 5), ((1, 22, 1), 9)),
    2: (((17, 7), 0), ((5, 19), 5), ((22, 2), 9)),
}


class Rechecking:
    """A policy that asks for a re-check (``Decision.recheck_steps``): from the first
    boundary (step 3) the first scripted plan, re-checked one settled step after it
    applies (step 5), and there the second; then it keeps the plan."""

    name = "rechecking"

    def initial(self, constraints, profiles=None):  # type: ignore[no-untyped-def]
        return equal_batches(constraints)

    def next_plan(self, history, current, constraints, profiles=None, horizon=None):  # type: ignore[no-untyped-def]
        (first, _), (second, _) = PLANS[len(current)][:2]
        if len(history) == 1:
            return Decision(first, True, "first move", recheck_steps=1)
        if len(history) == 2:
            return Decision(second, True, "second move")
        return Decision(tuple(current), False, "kept")


class ItemsOnly(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The same samples without ``get_batch``: forces the DataLoader path."""

    def __init__(self, inner: SyntheticImages) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner[i]


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
    return BNNet() if mode in ("syncbn", "bn") else DebugNet(num_classes=10, image_size=8)


def fp32_only() -> None:
    """No TF32 on CUDA: the comparison with one process is to fp32 rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def single_process_reference(
    mode: str, steps: int, global_batch: int, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """The same training as one process over the whole global batch: what DDP must equal
    (on CPU tensors, whatever ``device`` it ran on)."""
    from hetero.trainer.sampler import epoch_permutation

    fp32_only()
    dev = torch.device(device)
    model = build(mode).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    data = SyntheticImages(240, 8, 10, seed=1)
    loss_fn = nn.CrossEntropyLoss()
    per_epoch = len(data) // global_batch
    for step in range(steps):
        epoch, k = divmod(step, per_epoch)
        idx = epoch_permutation(len(data), 5, epoch)[k * global_batch : (k + 1) * global_batch]
        x, y = data.get_batch(idx, dev)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def main(argv: list[str]) -> None:
    out, mode = argv[0], argv[1]
    fp32_only()
    model = build(mode)
    ctx = ht.init(
        "dynamic" if mode in DYNAMIC else "equal",
        rebalance_interval=3,
        emulate_slowdown="2:30" if mode in DYNAMIC else None,
        warmup_steps=0,
    )
    comm = mode if mode in ("overlap", "deferred") else "auto"
    # One rank recomputing while the others keep their activations: the same gradients.
    recompute = "on" if mode.endswith("recompute") and ctx.rank == 1 else "off"
    if mode.startswith("shard-"):
        ddp = ctx.wrap(
            model,
            shard="grad_op" if mode == "shard-plain" else "full",
            offload="params" if mode == "shard-offload" else "none",
            activation_checkpointing=recompute,
        )
    else:
        # Tiny buckets (bytes), so DDP hands the hook several per step and deferral holds some.
        ddp = ctx.wrap(
            model,
            sync_batchnorm=mode == "syncbn",
            comm=comm,
            bucket_cap_mb=0.0001,
            activation_checkpointing=recompute,
        )
    # Buckets the hook held back when the step's last one arrived, per step (deferral).
    held_at_last: list[int] = []
    grads_ready = ctx.weighting.on_grads_ready

    def count_held() -> None:
        held_at_last.append(len(ctx.weighting.held))
        grads_ready()

    ctx.weighting.on_grads_ready = count_held
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.9)
    data = SyntheticImages(240, 8, 10, seed=1)
    if mode == "workers":
        loader = ctx.loader(ItemsOnly(data), GLOBAL_BATCH, seed=5, num_workers=2)
    else:
        loader = ctx.loader(data, GLOBAL_BATCH, seed=5)
    if mode == "recheck":
        assert isinstance(ctx.planner, EmbeddedPlanner)
        ctx.planner = EmbeddedPlanner(Rechecking(), ctx.planner.constraints)
    elif mode not in DYNAMIC:
        # Identical calls on every rank: uneven from the start, changed mid-run twice.
        for plan, step in PLANS[ctx.world_size]:
            ctx.set_plan(plan, step)
    loss_fn = nn.CrossEntropyLoss()
    sizes = []
    while ctx.global_step < STEPS:
        for x, y in loader:
            sizes.append(x.shape[0])
            loss = loss_fn(ddp(x), y)
            if mode in ("plainbackward", "shard-plain"):
                loss.backward()  # a loop that does not use ctx.backward
            else:
                ctx.backward(loss)
            opt.step()
            opt.zero_grad()
            ctx.step()
            if ctx.global_step >= STEPS:
                break
    if ctx.shard != "none":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # Collective: every rank gathers; rank 0 keeps the whole state.
        params = get_model_state_dict(ddp, options=StateDictOptions(full_state_dict=True))
    else:
        params = ddp.module.state_dict()
    if ctx.rank == 0:
        torch.save(
            {
                "params": {k: v.detach().cpu() for k, v in params.items()},
                "plans": [p.batches for p in ctx.plans],
                "reasons": [p.reason for p in ctx.plans],
                "comm": [(c.step, c.mode) for c in ctx.comm_changes],
                "held_at_last": held_at_last,
                "recompute": ctx.recompute.ranks,
            },
            out,
        )
    torch.save(sizes, f"{out}.rank{ctx.rank}.sizes")
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1:])
