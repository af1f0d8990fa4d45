"""The ideal throughput: each rank's standalone speed at its planned batch, summed.

The yardstick of ``docs/design.md``. Ranks are measured one at a time (the others wait at a
barrier), each running full training steps — forward, backward, the emulated
slowdown if any, optimizer — on a copy of the model with no communication, the
batch already on the device: it is gathered (or collated) before each step's
clock starts, and the time that took is kept beside the rate (``Solo.data_s``),
not in it. On a shared CPU this is what the rank achieves with the machine to
itself, so a balanced job's ratio to it includes contention between ranks. The
phase times (compute, optimizer) are what the gap breakdown sets against the
job's (``hetero.core.gap``).
"""

from __future__ import annotations

import gc
import inspect
import logging
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, default_collate

from hetero.core.gap import Solo
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


def solo_times(
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
) -> Solo:
    """``steps`` full training steps at ``batch`` alone: samples/s and phase medians.

    The rate is ``batch`` over the median of compute + optimizer (the batch on the
    device). ``make_model`` returns a fresh copy of the trained model on the device,
    so the measurement leaves the job's model and optimizer untouched. ``amp`` and
    ``memory_format`` must be the job's, so the ideal measures the same kernels.
    """
    model = make_model().train()
    opt = _like(optimizer, model)
    perm = epoch_permutation(len(dataset), seed, 10_000)  # type: ignore[arg-type]
    cuda = device.type == "cuda"
    data_s: list[float] = []
    compute_s: list[float] = []
    optimizer_s: list[float] = []
    step_s: list[float] = []
    for k in range(WARMUP_STEPS + steps):
        start = (k * batch) % max(len(perm) - batch, 1)
        t0 = time.perf_counter()
        x, y = _batch(dataset, perm[start : start + batch], device)
        if cuda:
            torch.cuda.synchronize(device)
        t_fwd = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
            loss = loss_fn(model(x.contiguous(memory_format=memory_format)), y)
        loss.backward()
        if cuda:
            torch.cuda.synchronize(device)
        emulate_wait(slowdown, time.perf_counter() - t_fwd)
        t_opt = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        t_end = time.perf_counter()
        if k >= WARMUP_STEPS:
            data_s.append(t_fwd - t0)
            compute_s.append(t_opt - t_fwd)
            optimizer_s.append(t_end - t_opt)
            step_s.append(t_end - t_fwd)
    med = statistics.median
    return Solo(batch, batch / med(step_s), med(data_s), med(compute_s), med(optimizer_s))


def standalone_rate(*args: Any, **kwargs: Any) -> float:
    """Samples/s of :func:`solo_times` (same arguments)."""
    return solo_times(*args, **kwargs).samples_per_s


def measure_standalone(*args: Any, **kwargs: Any) -> list[float]:
    """Every rank's standalone samples/s (:func:`measure_solo`, same arguments)."""
    return [s.samples_per_s for s in measure_solo(*args, **kwargs)]


def measure_solo(
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
) -> list[Solo]:
    """Every rank's solo measurement at its batch in ``plan``, on every rank (collective).

    With ``concurrent=True`` all ranks measure at once instead of one at a
    time: still no communication and no waiting for each other, but sharing the
    host as they do in training. On a CPU box the gap between the two is CPU
    contention; the gap between the concurrent figure and the job's throughput
    is what imbalance and communication cost. A rank that runs out of memory
    reports a rate of 0 (no ideal).
    """
    mine = Solo(plan[ctx.rank], 0.0)
    slowdown = ctx.slowdown_at(max(ctx.global_step - 1, 0))
    turns: list[int | None] = [None] if concurrent else list(range(ctx.world_size))
    for turn in turns:
        ctx.barrier()
        if turn is None or turn == ctx.rank:
            try:
                mine = solo_times(
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
                gc.collect()
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
                log.warning(
                    "rank %d: the standalone measurement ran out of memory; no ideal", ctx.rank
                )
    ctx.barrier()
    fields = [float(mine.batch), mine.samples_per_s, *(_nan(x) for x in _phases(mine))]
    if ctx.world_size == 1:
        return [mine]
    local = torch.tensor(fields, dtype=torch.float64, device=ctx.device)
    out = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(out, local)
    solos = []
    for t in out:
        b, rate, d, c, o = (float(v) for v in t.tolist())
        solos.append(Solo(int(b), rate, _none(d), _none(c), _none(o)))
    return solos


def _phases(s: Solo) -> tuple[float | None, float | None, float | None]:
    return s.data_s, s.compute_s, s.optimizer_s


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _like(optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
    """A fresh optimizer of ``optimizer``'s class and settings over ``model``'s parameters.

    Only the settings its constructor takes: AdamW's ``defaults`` carries
    ``decoupled_weight_decay``, which ``AdamW.__init__`` does not accept.
    """
    accepted = inspect.signature(type(optimizer).__init__).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return type(optimizer)(model.parameters(), **settings)
