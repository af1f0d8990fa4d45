"""Activation checkpointing per rank: on or off everywhere, or chosen at start-up where
memory, not speed, binds a rank.

``activation_checkpointing`` (job.yaml, ``--activation-checkpointing``, ``ht.init`` or
``ctx.wrap``) is ``on``, ``off`` or ``auto`` (the default). ``on`` and ``off`` set the
model's switch (``hetero.trainer.models.recompute``) on every rank when it is
wrapped. A model without a switch gets one under ``on`` and ``auto``: its repeated
blocks, found and given composable checkpointing by ``hetero.trainer.models.repeated``
(none found: ``on`` is refused, ``auto`` leaves the model as it is and says so);
``off`` leaves such a model untouched. ``auto`` leaves the switch as the model has
it, and the start-up memory probe (``hetero.trainer.memprobe``) decides per rank:

1. The probe measures every rank's line ``peak(b) = fixed + per_sample · b`` without
   recomputation, and from it the rank's cap under its memory limit.
2. A rank whose cap holds it below its share of the first plan (the speed plan: equal,
   or in proportion to the ranks' compute scores) turns recomputation on when that
   pays: when its cap cannot hold ``min_batch``, or when, at the third more compute
   per sample recomputation costs, it would still run more samples than its cap in
   the step time the capped plan would take (``hetero.core.memfit.recompute_wanted``
   states the rule and why).
3. If any rank turned it on, every rank runs the probe again (its passes are
   collective), and a rank keeps recomputation only if its cap rose; the caps of the
   first plan are the chosen mode's.

The choice is made once, before step 0, and never changes during the run. So no
interval's timing mixes steps with and without recomputation (the planner's line of
a rank that recomputes is measured at the slower speed from its first interval on),
and the memory caps the run re-fits from its peaks are the chosen mode's as well.
The probe's own passes are not timed (``StepClock.discard``). A cap set by
``max_batch`` never turns recomputation on: it is a limit the user chose, which
recomputation cannot raise, so it would cost compute for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hetero.core.errors import ConfigError
from hetero.core.memfit import RECOMPUTE_SLOWDOWN, ProbedRank, recompute_wanted
from hetero.trainer.models import repeated
from hetero.trainer.models.recompute import recomputing, set_recompute, switches

if TYPE_CHECKING:
    from hetero.trainer.context import Context
    from hetero.trainer.memprobe import ProbeResult

AUTO, ON, OFF = "auto", "on", "off"


@dataclass(frozen=True)
class RecomputeChoice:
    """Which ranks recompute their activations and why, in rank order; ``mode`` is the
    option (``auto``, ``on``, ``off``); ``blocks``, what a model without a switch of its
    own has recomputed (``repeated.Found.text``, e.g. ``8 BasicBlock: layer1.0 …
    layer4.1``; empty for a model with a switch or none found)."""

    mode: str
    ranks: tuple[bool, ...]
    reasons: tuple[str, ...]
    blocks: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the run's summary."""
        out = {"mode": self.mode, "ranks": list(self.ranks), "reasons": list(self.reasons)}
        return {**out, "blocks": self.blocks} if self.blocks else out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecomputeChoice:
        """The choice from :meth:`as_dict`'s form (a summary's ``recompute`` field)."""
        return cls(d["mode"], tuple(d["ranks"]), tuple(d["reasons"]), d.get("blocks", ""))

    def text(self) -> str:
        """One line for the summary table: the ranks that recompute, and why."""
        on = [i for i, r in enumerate(self.ranks) if r]
        why = self.reasons[0].split(": ", 1)[-1]
        if not on and len(set(self.reasons)) == 1:
            return f"off on every rank ({why})"
        if not on:
            return f"off on every rank ({self.mode})"
        what = f"; recomputed: {self.blocks}" if self.blocks else ""
        if len(on) == len(self.ranks) and len(set(self.reasons)) == 1:
            return f"on on every rank ({why}){what}"
        return "; ".join(f"rank {i} {self.reasons[i]}" for i in on) + what


def rank_flags(ctx: Context, mine: bool) -> tuple[bool, ...]:
    """Every rank's ``mine``, in rank order (collective: call it on every rank)."""
    if ctx.world_size == 1:
        return (mine,)
    flags = torch.zeros(ctx.world_size, dtype=torch.int32, device=ctx.device)
    flags[ctx.rank] = int(mine)
    dist.all_reduce(flags)
    return tuple(bool(f) for f in flags.tolist())


def apply_mode(
    ctx: Context,
    model: nn.Module,
    mode: str,
    *,
    sync_batchnorm: bool,
    units: Sequence[nn.Module] = (),
) -> None:
    """Set ``model``'s switch for ``mode`` at ``wrap`` (``auto`` leaves it as the model has
    it) and record every rank's (collective: the ranks may have been given different
    modes through ``ctx.wrap``). A model without a switch first gets its repeated blocks
    one (not under ``off``); ``units`` are the FSDP units it will be sharded into, which
    no recomputed block may strictly contain (``repeated``'s module doc). With
    ``sync_batchnorm`` every rank or none must recompute: a recomputed SyncBatchNorm
    gathers its statistics again, a collective its peers would not join."""
    found = None
    if mode != OFF and not switches(model):
        found = repeated.attach(model, units)
    if mode != AUTO and not set_recompute(model, mode == ON) and mode == ON:
        inside = ", none holding an FSDP unit" if units else ""
        raise ConfigError(
            "activation_checkpointing on: the model has no activation_checkpointing switch "
            f"and no {repeated.LOOKED_FOR}{inside} (docs/trainer.md says how a model opts in)"
        )
    ranks = rank_flags(ctx, recomputing(model))
    if sync_batchnorm and len(set(ranks)) > 1:
        raise ConfigError(
            "activation_checkpointing: with sync_batchnorm every rank or none recomputes "
            f"(ranks {[i for i, r in enumerate(ranks) if r]} only were set to)"
        )
    if mode != AUTO:
        why = f"activation_checkpointing {mode}"
    elif switches(model):
        why = "auto: no memory probe ran"
    else:
        why = f"auto: the model has no switch and no {repeated.LOOKED_FOR.split(':')[0]}"
    reasons = tuple(f"{'on' if r else 'off'}: {why}" for r in ranks)
    ctx.recompute = RecomputeChoice(mode, ranks, reasons, found.text() if found else "")


def _reason(cap: int | None, want: int, turned: bool, kept: bool, after: int | None) -> str:
    if kept:
        return f"on: memory holds {cap} of the {want} samples the first plan wants; {after} recomputing"
    if turned:
        return f"off: recomputing did not raise its cap of {cap} (memory holds {after} with it)"
    if cap is None:
        return "off: no memory cap measured"
    if cap >= want:
        return f"off: memory holds the {want} samples the first plan wants (cap {cap})"
    return (
        f"off: memory holds {cap} of {want} samples, too close for {RECOMPUTE_SLOWDOWN:.2f}x "
        "compute per sample to pay"
    )


def probe_choosing(
    ctx: Context,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch_fn: Callable[[int], Any],
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    margin: float,
    fraction: float | None,
    share: int | None,
) -> ProbeResult | None:
    """The start-up memory probe (``hetero.trainer.memprobe.probe``, collective), and under
    ``auto`` the per-rank choice of recomputation the module doc describes. Returns the
    probe's result for the chosen modes; raises ``PlanError`` when a rank cannot hold
    ``min_batch`` even recomputing."""
    from hetero.trainer.memprobe import ProbeResult, final_caps, probe

    # A recomputed SyncBatchNorm would gather statistics its peers do not: never per rank.
    synced = any(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
    mine = ctx.recompute.mode == AUTO and bool(switches(model)) and not synced
    auto = all(rank_flags(ctx, mine))
    kw: dict[str, Any] = {"margin": margin, "fraction": fraction, "share": share}
    first = probe(ctx, model, optimizer, batch_fn, loss_fn, strict=not auto, **kw)
    if first is None and auto:
        why = "off: auto, but no rank could measure its memory (CPU ranks)"
        old = ctx.recompute
        reasons = tuple(r if on else why for on, r in zip(old.ranks, old.reasons, strict=True))
        ctx.recompute = RecomputeChoice(AUTO, old.ranks, reasons, old.blocks)
    if first is None or not auto:
        return first
    min_batch = ctx.config.min_batch
    wanted = ctx.plan
    already = ctx.recompute.ranks
    turn = tuple(
        t and not a
        for t, a in zip(recompute_wanted(first.caps, wanted, min_batch), already, strict=True)
    )
    second: ProbeResult | None = None
    if any(turn):
        if turn[ctx.rank]:
            set_recompute(model, True)
        second = probe(ctx, model, optimizer, batch_fn, loss_fn, strict=False, **kw)
    after = second.caps if second is not None else first.caps
    kept = tuple(
        t and a is not None and (c is None or a > c)
        for t, a, c in zip(turn, after, first.caps, strict=True)
    )
    if turn[ctx.rank] and not kept[ctx.rank]:
        set_recompute(model, False)
    chosen = second if second is not None and kept[ctx.rank] else first
    ranks: tuple[ProbedRank | None, ...] = tuple(
        s if k else f for f, s, k in zip(first.ranks, (second or first).ranks, kept, strict=True)
    )
    reasons = tuple(
        ctx.recompute.reasons[i] if a else _reason(c, w, t, k, n)
        for i, (a, c, w, t, k, n) in enumerate(
            zip(already, first.caps, wanted, turn, kept, after, strict=True)
        )
    )
    ctx.recompute = RecomputeChoice(
        AUTO,
        tuple(a or k for a, k in zip(already, kept, strict=True)),
        reasons,
        ctx.recompute.blocks,
    )
    caps = final_caps(ranks, margin, min_batch, ctx.world_size)
    return ProbeResult(ranks, caps, chosen.points)
