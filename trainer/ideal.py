"""The ideal throughput: each rank's standalone speed at its planned batch, summed.

The yardstick of ``docs/design.md``. Ranks are measured one at a time (the others wait at a
barrier), each running full training steps — data, forward, backward, the
emulated slowdown if any, optimizer — on a copy of the model with no
communication. On a shared CPU this is what the rank achieves with the machine
to itself, so a balanced job's ratio to it includes contention between ranks.
"""

from __future__ import annotations

import gc
import inspect
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, default_collate

from hetero.trainer.context import Context
from hetero.trainer.emulation import emulate_wait
from hetero.trainer.sampler import epoch_permutation

log = logging.getLogger("hetero.trainer.ideal")

WARMUP_STEPS = 2


def _batch(dataset: Dataset[Any], indices: list[int], device: torch.device) -> Any:
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(indices, device)
    x, y = default_collate([dataset[i] for i in indices])
    return x.to(device), y.to(device)


def standalone_rate(
    make_model: Callable[[], nn.Module],
    optimizer: torch.optim.Optimizer,
    dataset: Dataset[Any],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batch: int,
    *,
    steps: int,
    slowdown: float,
    device: torch.device,
    seed: int,
    amp: str = "none",
    memory_format: torch.memory_format = torch.contiguous_format,
) -> float:
    """Samples/s of ``steps`` full training steps at ``batch`` (median step time).

    ``make_model`` returns a fresh copy of the trained model on the device, so
    the measurement leaves the job's model and optimizer untouched. ``amp`` and
    ``memory_format`` must be the job's, so the ideal measures the same kernels.
    """
    model = make_model().train()
    opt = _like(optimizer, model)
    perm = epoch_permutation(len(dataset), seed, 10_000)  # type: ignore[arg-type]
    times = []
    for k in range(WARMUP_STEPS + steps):
        start = (k * batch) % max(len(perm) - batch, 1)
        t0 = time.perf_counter()
        x, y = _batch(dataset, perm[start : start + batch], device)
        t_fwd = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
            loss = loss_fn(model(x.contiguous(memory_format=memory_format)), y)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        emulate_wait(slowdown, time.perf_counter() - t_fwd)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if k >= WARMUP_STEPS:
            times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def measure_standalone(
    ctx: Context,
    make_model: Callable[[], nn.Module],
    optimizer: torch.optim.Optimizer,
    dataset: Dataset[Any],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    plan: tuple[int, ...],
    *,
    steps: int,
    seed: int,
    concurrent: bool = False,
    amp: str = "none",
    memory_format: torch.memory_format = torch.contiguous_format,
) -> list[float]:
    """Every rank's standalone samples/s at its batch in ``plan``, on every rank.

    With ``concurrent=True`` all ranks measure at once instead of one at a
    time: still no communication and no waiting for each other, but sharing the
    host as they do in training. On a CPU box the gap between the two is CPU
    contention; the gap between the concurrent figure and the job's throughput
    is what imbalance and communication cost.
    """
    mine = 0.0
    slowdown = ctx.slowdown_at(max(ctx.global_step - 1, 0))
    turns: list[int | None] = [None] if concurrent else list(range(ctx.world_size))
    for turn in turns:
        ctx.barrier()
        if turn is None or turn == ctx.rank:
            try:
                mine = standalone_rate(
                    make_model,
                    optimizer,
                    dataset,
                    loss_fn,
                    plan[ctx.rank],
                    steps=steps,
                    slowdown=slowdown,
                    device=ctx.device,
                    seed=seed,
                    amp=amp,
                    memory_format=memory_format,
                )
            except torch.OutOfMemoryError:
                # A second model and optimizer beside the trained ones do not fit a rank
                # held to its memory cap: no ideal, but the peers' barriers still meet.
                mine = 0.0
                gc.collect()
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
                log.warning(
                    "rank %d: the standalone measurement ran out of memory; no ideal", ctx.rank
                )
    ctx.barrier()
    if ctx.world_size == 1:
        return [mine]
    local = torch.tensor([mine], dtype=torch.float64, device=ctx.device)
    out = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(out, local)
    return [float(t.item()) for t in out]


def _like(optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
    """A fresh optimizer of ``optimizer``'s class and settings over ``model``'s parameters.

    Only the settings its constructor takes: AdamW's ``defaults`` carries
    ``decoupled_weight_decay``, which ``AdamW.__init__`` does not accept.
    """
    accepted = inspect.signature(type(optimizer).__init__).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return type(optimizer)(model.parameters(), **settings)
