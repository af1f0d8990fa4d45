"""The start-up memory probe: each rank's peak memory measured before step 0.

The caps of :mod:`hetero.trainer.memory` come from the peaks of intervals that
ran, so the first plan (the equal split, or the profiles' split) knew nothing of
memory: a rank on a small device ran out of memory at step 0. Sharded, that is
fatal, since a rank cannot retry a step alone while its peers wait inside FSDP2's
all-gathers. The probe closes that gap:

1. Every rank runs forward and backward on its first ``b`` and ``2b`` samples
   (``b = min_batch``) after one unmeasured warm-up pass at ``b`` (the first pass
   allocates one-time workspaces that would otherwise inflate its peak and flatten
   the line), and records ``torch.cuda.max_memory_allocated`` over each, reset in
   between. The passes are collective under DDP and FSDP2 (all-reduces,
   all-gathers, reduce-scatters), so every rank runs the same sizes together.
   A peak is convex in the batch (each moment of a pass holds its own fixed part
   and its own bytes per sample), so while any rank's peaks are flat or still bend
   the batch doubles again, up to the equal share and only where the next pass is
   bounded within every rank's limit (:func:`hetero.core.memfit.probe_line_bends`,
   :func:`~hetero.core.memfit.probe_pass_fits`); the line goes through the last two.
2. The optimizer state is allocated by the first ``optimizer.step()``, after the
   probe: it is counted from this rank's parameters (or shards), ``bytes ×
   state tensors`` per parameter (:func:`optimizer_state_bytes`).
3. ``peak(b) = fixed + per_sample · b`` through the two points, plus the
   optimizer state (``hetero.core.memfit.ProbedRank``), gives each rank's cap
   under its budget (``memory_fraction × total`` where set) less the margin; the
   ranks' findings are all-gathered so that every rank computes the same caps,
   or the same one-line error when a rank cannot hold ``min_batch``.

**Training is unchanged.** The passes run under ``torch.random.fork_rng`` (dropout
draws nothing from the run's streams), the model's buffers are restored afterwards
(BatchNorm's running statistics), gradients are dropped (``set_to_none``) and the
optimizer never steps, the comm hook's scale is restored, and the step clock
forgets the passes' marks; the sampler is not touched (the samples are read from
the dataset by index). So a run with the probe computes bit for bit what it
computes without.

Where nothing can be measured (CPU ranks: a process's RSS has no resettable peak)
the probe is a no-op, logged at debug level. ``HETERO_PROBE_MEMORY``
(``RANK:BUDGET:FIXED:PER_SAMPLE[:RECOMPUTED],...``, bytes) makes those ranks report
``FIXED + PER_SAMPLE · b`` under a limit of ``BUDGET`` instead of measuring
(``RECOMPUTED`` per sample instead while the model checkpoints its activations), so
the passes and the caps they give can be tested on CPU ranks.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from hetero.core.errors import ConfigError, HeteroError
from hetero.core.memfit import (
    GIB,
    ProbedRank,
    probe_caps,
    probe_fit,
    probe_line_bends,
    probe_pass_fits,
)
from hetero.trainer.activations import rank_flags
from hetero.trainer.context import Context
from hetero.trainer.memory import budget_bytes
from hetero.trainer.models.recompute import recomputing

log = logging.getLogger("hetero.trainer.memprobe")

INJECT_ENV = "HETERO_PROBE_MEMORY"

#: ``rank -> (budget_bytes, fixed_bytes, per_sample_bytes, per_sample_bytes recomputing)``
#: of injected ranks (tests on CPU); the last is the third when not given.
Injected = dict[int, tuple[float, float, float, float]]


def parse_injection(text: str | None) -> Injected:
    """``RANK:BUDGET:FIXED:PER_SAMPLE[:RECOMPUTED],...`` (bytes, float syntax) as ``{rank:
    (budget, fixed, per_sample, recomputed)}``; a ``ConfigError`` naming the variable for
    anything else."""
    out: Injected = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            rank, budget, fixed, per_sample, *more = part.strip().split(":")
            if len(more) > 1:
                raise ValueError(part)
            recomputed = float(more[0]) if more else float(per_sample)
            out[int(rank)] = (float(budget), float(fixed), float(per_sample), recomputed)
        except ValueError:
            raise ConfigError(
                f"{INJECT_ENV}: cannot parse {part!r} (RANK:BUDGET:FIXED:PER_SAMPLE[:RECOMPUTED])"
            ) from None
    return out


def _state_tensors(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> int:
    """Tensors of parameter size each parameter's state holds after the first step."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 3 if group.get("amsgrad") else 2
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if group.get("momentum") else 0
    if isinstance(optimizer, (torch.optim.RMSprop,)):
        return 1 + bool(group.get("momentum")) + bool(group.get("centered"))
    if isinstance(optimizer, torch.optim.Adagrad):
        return 1
    return 2  # an optimizer not listed: assume Adam's two buffers (errs towards a lower cap)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Bytes of optimizer state the first ``optimizer.step()`` will allocate on ``device``:
    per parameter of this rank (its shard under FSDP2, its partition under ZeRO) not yet
    holding state (a resumed run's is already allocated), ``state tensors × its bytes``.
    Parameters kept on the host (``offload``) count nothing."""
    opt: torch.optim.Optimizer = getattr(optimizer, "optim", optimizer)  # ZeRO: local part
    total = 0
    for group in opt.param_groups:
        per_param = _state_tensors(opt, group)
        for p in group["params"]:
            if opt.state.get(p):
                continue
            local = p.to_local() if isinstance(p, DTensor) else p
            if local.device.type == device.type:
                total += per_param * local.numel() * local.element_size()
    return total


@dataclass(frozen=True)
class ProbeResult:
    """Every rank's findings (``None`` for a rank that could not measure) and the caps
    they give (``None``: no cap from the probe), in rank order; this rank's points."""

    ranks: tuple[ProbedRank | None, ...]
    caps: tuple[int | None, ...]
    points: tuple[tuple[int, int], ...]

    def step_points(self, rank: int) -> list[tuple[int, int]]:
        """``rank``'s points as a training step's peaks (``(batch, bytes)``): the probe's
        plus the optimizer state, as :class:`hetero.trainer.memory.MemoryMonitor` records."""
        found = self.ranks[rank]
        extra = int(found.optimizer_bytes) if found is not None else 0
        return [(b, p + extra) for b, p in self.points]

    def as_dicts(self) -> list[dict[str, float | int | None] | None]:
        """JSON-ready rows for the summary (bytes, samples)."""
        return [
            None
            if r is None
            else {
                "fixed_bytes": r.fit.fixed_bytes,
                "per_sample_bytes": r.fit.per_sample_bytes,
                "optimizer_bytes": r.optimizer_bytes,
                "budget_bytes": r.budget_bytes,
                "cap": cap,
            }
            for r, cap in zip(self.ranks, self.caps, strict=True)
        ]


@contextmanager
def _quiet(ctx: Context, model: nn.Module) -> Iterator[None]:
    """Leave no trace of the passes: RNG streams, buffers, gradients, train mode, the comm
    hook's scale and the step clock as they were (see the module doc)."""
    buffers = [(b, b.detach().to("cpu", copy=True)) for b in model.buffers()]
    was_training, scale = model.training, ctx.weighting.scale
    devices = [ctx.device] if ctx.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        model.train()
        try:
            yield
        finally:
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            model.train(was_training)
            ctx.weighting.scale = scale
            ctx.clock.discard()
            ctx.clock.restart()


def _any(ctx: Context, mine: bool) -> bool:
    """Whether any rank says yes (collective)."""
    return any(rank_flags(ctx, mine))


def probe(
    ctx: Context,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch_fn: Callable[[int], Any],
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    margin: float,
    fraction: float | None = None,
    share: int | None = None,
    strict: bool = True,
) -> ProbeResult | None:
    """Run the probe (collective: call it on every rank, before the first step) and return
    every rank's findings and caps; ``None`` where no rank can measure. ``batch_fn(n)`` is
    a batch of ``n`` samples on this rank's device, ``loss_fn(batch)`` its mean loss through
    ``model``. Raises ``PlanError`` (the same on every rank) when a rank cannot hold
    ``min_batch``, unless not ``strict`` (then such a rank's cap is below it: the caller
    decides, as ``trainer.activations`` does). ``share`` (the equal split of the global
    batch) bounds the doubling while the peaks are flat or bend."""
    injected = parse_injection(os.environ.get(INJECT_ENV)).get(ctx.rank)
    cuda = ctx.device.type == "cuda"
    if not _any(ctx, cuda or injected is not None):
        log.debug("memory probe skipped: no rank can measure its peak memory (CPU ranks)")
        return None
    small = ctx.config.min_batch
    sizes = (small, small, 2 * small)  # the first pass warms up and is not measured
    share = max(share or 0, 2 * small)
    points: list[tuple[int, int]] = []
    limit = budget_bytes(ctx.device, fraction) * (1 - margin) if cuda else math.inf
    with _quiet(ctx, model):
        floor = torch.cuda.memory_allocated(ctx.device) if cuda else 0
        for i, size in enumerate(sizes):
            peak = _measured_pass(ctx, model, batch_fn, loss_fn, size, fraction)
            if i > 0 and peak is not None:
                points.append((size, peak))
        # Peaks are convex in the batch (see probe_line_bends): double it, every rank
        # together, up to the equal share the first plan runs anyway, while any rank's
        # line still bends and every rank's next pass surely fits.
        size = 2 * small
        while 2 * size <= share:
            bends = rank_flags(ctx, cuda and probe_line_bends(points))
            fits = rank_flags(ctx, probe_pass_fits(points, floor, limit))
            if not any(bends) or not all(fits):
                break
            size *= 2
            peak = _measured_pass(ctx, model, batch_fn, loss_fn, size, fraction)
            if peak is not None:
                points.append((size, peak))
    if cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)  # the first interval's peak is its own
    mine: ProbedRank | None = None
    if injected is not None:
        budget, fixed, per_sample, recomputed = injected
        per_sample = recomputed if recomputing(model) else per_sample
        points = [(b, int(fixed + per_sample * b)) for b in sizes[1:]]
    fit = probe_fit(points[-2:])
    if fit is not None:
        budget = injected[0] if injected is not None else budget_bytes(ctx.device, fraction)
        state = optimizer_state_bytes(optimizer, ctx.device)
        mine = ProbedRank(ctx.rank, str(ctx.device), fit, float(state), float(budget))
    elif cuda:
        log.debug("memory probe: peaks %s do not rise with the batch; no cap", points)
    ranks: list[ProbedRank | None] = [mine] * ctx.world_size
    if ctx.world_size > 1:
        dist.all_gather_object(ranks, mine)
    caps = final_caps(ranks, margin, small, ctx.world_size, strict=strict)
    log.info("memory probe: caps %s", list(caps))
    return ProbeResult(tuple(ranks), caps, tuple(points))


def final_caps(
    ranks: Sequence[ProbedRank | None],
    margin: float,
    min_batch: int,
    world_size: int,
    *,
    strict: bool = True,
) -> tuple[int | None, ...]:
    """Each rank's cap from its findings (``None``: no cap), in rank order; a ``PlanError``
    for the first rank that cannot hold ``min_batch`` when ``strict``."""
    found = [r for r in ranks if r is not None]
    held = probe_caps(found, margin, min_batch) if strict else [r.cap(margin) for r in found]
    capped = dict(zip((r.rank for r in found), held, strict=True))
    return tuple(capped.get(r) for r in range(world_size))


def _measured_pass(
    ctx: Context,
    model: nn.Module,
    batch_fn: Callable[[int], Any],
    loss_fn: Callable[[Any], torch.Tensor],
    size: int,
    fraction: float | None,
) -> int | None:
    """Forward and backward at ``size`` samples; the peak allocated meanwhile (bytes; None
    off CUDA). Gradients are dropped after, so the next pass starts from the same state."""
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
    try:
        loss_fn(batch_fn(size)).backward()
        if cuda:
            torch.cuda.synchronize(ctx.device)
    except torch.OutOfMemoryError:
        limit = budget_bytes(ctx.device, fraction) / GIB if cuda else float("nan")
        raise HeteroError(
            f"rank {ctx.rank} ({ctx.device}) ran out of memory in the start-up memory probe "
            f"at batch {size} (limit {limit:.2f} GiB): its share of the model and "
            f"{size} sample(s) do not fit"
        ) from None
    except ValueError as exc:  # a layer that refuses so small a batch (BatchNorm1d at 1)
        raise HeteroError(
            f"the start-up memory probe failed at batch {size}: {str(exc).splitlines()[0]} "
            f"(raise min_batch, or turn the probe off with memory_probe false)"
        ) from None
    peak = int(torch.cuda.max_memory_allocated(ctx.device)) if cuda else None
    model.zero_grad(set_to_none=True)
    return peak


def probe_memory(
    ctx: Context,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any], torch.Tensor],
    batch_fn: Callable[[int], Any] | None = None,
    *,
    margin: float = 0.1,
    fraction: float | None = None,
) -> tuple[int | None, ...] | None:
    """:func:`probe`, then its caps made binding from the first step (``Context.probe_memory``
    documents it); the caps in force after, or ``None`` when nothing was measured."""
    from hetero.trainer.activations import probe_choosing
    from hetero.trainer.memory import apply_caps, combine

    loader = ctx._require_loader()
    if fraction is None and ctx.device.type == "cuda":
        fraction = torch.cuda.get_per_process_memory_fraction(ctx.device)
    result = probe_choosing(
        ctx,
        model,
        optimizer,
        batch_fn or loader.samples,
        loss_fn,
        margin=margin,
        fraction=fraction,
        share=loader.sampler.global_batch // ctx.world_size,
    )
    if result is None or all(c is None for c in result.caps):
        return None
    caps = combine(ctx.max_batch, result.caps)
    assert caps is not None
    apply_caps(ctx, caps, f"memory probe {list(caps)}", first=0)
    return caps
