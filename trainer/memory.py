"""Per-rank memory caps: the largest batch each rank's memory holds, fed to the planner.

At every rebalance boundary each rank estimates

    per_sample_bytes = (peak_bytes − base_bytes) / max_batch
    cap              = ⌊(budget_bytes · (1 − margin) − base_bytes) / per_sample_bytes⌋

(on a GPU, once peaks at two or more batch sizes are known, the line
``peak = fixed + per_sample · b`` fitted over them, ``hetero.core.memfit``,
instead), where ``peak_bytes`` is the interval's peak (``torch.cuda.max_memory_allocated``
on a GPU, the process's peak RSS on a CPU), ``base_bytes`` what stays
allocated between steps (parameters, optimizer state), ``max_batch`` the
largest batch the rank ran in the interval (the peak belongs to it), and
``budget_bytes`` the memory the rank may use: on a GPU the device's free memory
plus what this process's allocator already holds, at most
``memory_fraction × total`` when a fraction is set; on a CPU the host's
available memory shared among the local ranks. The fixed part of the peak
(workspaces) is counted as per-sample memory, so the estimate errs low.

The caps are all-gathered (one small collective per interval), combined
with configured caps (``--max-batch``) and caps learned from out-of-memory
errors (:mod:`hetero.trainer.oom`), and made binding with :func:`apply_caps`:
the planner's constraints take them, and a plan that exceeds one is cut down
at once. Every rank computes the same plan from the same gathered caps, so no
broadcast is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hetero.core.balancer import Constraints, round_to_plan
from hetero.core.catalogue import BY_NAME, OptionError
from hetero.core.errors import HeteroError, PlanError
from hetero.core.memfit import MemoryFit, fit_memory
from hetero.core.rankenv import RankEnv
from hetero.trainer.context import Context
from hetero.trainer.rebalance import PlanRecord
from hetero.trainer.sampler import PlanSchedule

log = logging.getLogger("hetero.trainer.memory")

#: Intervals of (batch, peak) the fit keeps: enough sizes to separate the fixed part,
#: recent enough to follow a model whose memory changes (allocator growth).
_POINTS = 16

Caps = tuple[int | None, ...]


def parse_max_batch(text: str | None, world_size: int) -> Caps | None:
    """``max_batch``: one cap for every rank (``64``) or one per rank (``64,128,-``).

    The syntax is the catalogue's (``hetero.core.catalogue``); an error is an
    ``OptionError`` naming ``max_batch``."""
    if not text:
        return None
    text = BY_NAME["max_batch"].check(text)
    caps = [None if p == "-" else int(p) for p in text.split(",")]
    if len(caps) == 1:
        caps = caps * world_size
    if len(caps) != world_size:
        raise OptionError("max_batch", f"has {len(caps)} caps for {world_size} ranks")
    return tuple(caps)


def combine(*caps: Caps | None) -> Caps | None:
    """Elementwise minimum, ``None`` meaning no cap."""
    present = [c for c in caps if c is not None]
    if not present:
        return None
    out: list[int | None] = []
    for values in zip(*present, strict=True):
        known = [v for v in values if v is not None]
        out.append(min(known) if known else None)
    return tuple(out)


def budget_bytes(device: torch.device, fraction: float | None = None) -> int:
    """Bytes this rank may allocate in all (see the module doc)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        ours = free + torch.cuda.memory_reserved(device)
        return int(min(ours, fraction * total)) if fraction else int(ours)
    import psutil

    local = RankEnv.from_env().local_world_size or 1
    rss = psutil.Process().memory_info().rss
    return int(psutil.virtual_memory().available // max(local, 1) + rss)


def base_bytes(device: torch.device) -> int:
    """Bytes allocated between steps: parameters, gradients kept, optimizer state."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.Process().memory_info().rss)


def cap_from(budget: int, base: int, peak: int, batch: int, margin: float) -> int | None:
    """The largest batch that fits ``budget`` with ``margin`` left free; ``None`` if unknown."""
    per_sample = (peak - base) / batch if batch > 0 else 0.0
    if per_sample <= 0:
        return None  # nothing measurable (a CPU whose RSS peak predates the interval)
    return max(int((budget * (1.0 - margin) - base) // per_sample), 0)


def gather_caps(mine: int | None, world_size: int, device: torch.device) -> Caps:
    """Every rank's cap, in rank order (-1 travels for ``None``)."""
    if world_size == 1:
        return (mine,)
    local = torch.tensor([-1 if mine is None else mine], dtype=torch.int64, device=device)
    out = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(out, local)
    return tuple(None if int(t.item()) < 0 else int(t.item()) for t in out)


def apply_caps(
    ctx: Context, caps: Caps, reason: str, first: int | None = None
) -> tuple[int, ...] | None:
    """Make ``caps`` binding from step ``first`` on; the new plan if one was needed.

    Call identically on every rank (the caps are gathered, so they are), with a
    ``first`` no rank's loader has cut yet, the same on every rank: loaders with
    different worker counts prefetch to different depths. Default: this rank's
    sampler's next step (right alone). Raises ``HeteroError`` when the caps
    together cannot hold the global batch.
    """
    loader = ctx._require_loader()
    plan = ctx.plan
    try:
        constraints = Constraints(sum(plan), ctx.world_size, ctx.config.min_batch, caps)
    except PlanError as exc:
        raise HeteroError(
            f"the ranks' memory cannot hold the global batch {sum(plan)}: {exc} "
            f"(lower --global-batch)"
        ) from None
    ctx.set_max_batch(caps)

    def fits(p: tuple[int, ...]) -> bool:
        return all(c is None or b <= c for b, c in zip(p, caps, strict=True))

    # Every plan that applies from the next step the sampler produces: the one in
    # force then and any scheduled later (steps already produced keep their cut).
    sampler = loader.sampler
    first = max(sampler.global_step, first or 0)
    sched = sampler.schedule
    keep = [(s, p) for s, p in zip(sched.starts, sched.plans, strict=True) if s < first]
    later = [(s, p) for s, p in zip(sched.starts, sched.plans, strict=True) if s > first]
    upcoming = [(first, sched.at(first)), *later]
    if all(fits(p) for _, p in upcoming):
        return None
    version = ctx.plans[-1].version
    clamped = []
    for start, p in upcoming:
        new = p if fits(p) else round_to_plan([float(b) for b in p], constraints)
        if new != p:
            version += 1
            ctx.plans.append(PlanRecord(version, start, new, reason))
        clamped.append((start, new))
    merged = keep + clamped
    sampler.schedule = PlanSchedule([s for s, _ in merged], [p for _, p in merged])
    return clamped[-1][1]


@dataclass(frozen=True)
class Estimate:
    """One rank's memory estimate at one boundary (bytes, samples)."""

    step: int
    budget_bytes: int
    base_bytes: int
    peak_bytes: int
    batch: int
    cap: int | None
    #: The fitted line's peak at ``batch`` (bytes; None without a fit): to compare with
    #: the peak measured there (``hetero.core.memfit``).
    predicted_bytes: float | None = None


class MemoryMonitor:
    """Measures this rank's cap at each boundary and keeps every rank's caps binding.

    ``measure=False`` keeps only configured and learned caps (no estimate).
    Call :meth:`after_step` after every ``ctx.step()``.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        margin: float = 0.1,
        configured: Caps | None = None,
        fraction: float | None = None,
        measure: bool = True,
    ) -> None:
        self.ctx = ctx
        self.margin = margin
        self.configured = configured
        self.fraction = fraction
        self.measure = measure
        self.measured: Caps | None = None
        self.learned: Caps | None = None  # from out-of-memory errors; only ever lowered
        self.caps: Caps | None = configured
        self.estimates: list[Estimate] = []
        self._max_batch = 0
        self._seen_intervals = len(ctx.summaries)
        #: ``(largest batch, peak bytes)`` of each measured interval, newest last.
        self.points: list[tuple[int, int]] = []
        self.fit: MemoryFit | None = None

    def after_step(self, batch: int) -> None:
        """Record this step's batch; at a boundary, re-estimate and apply the caps."""
        self._max_batch = max(self._max_batch, batch)
        if len(self.ctx.summaries) == self._seen_intervals:
            return
        self._seen_intervals = len(self.ctx.summaries)
        if self.measure:
            self.measured = gather_caps(self._estimate(), self.ctx.world_size, self.ctx.device)
        self._max_batch = 0
        # Past every rank's loader lookahead, which the boundary's summaries carry.
        lookahead = max(s.lookahead for s in self.ctx.summaries[-1])
        self.update(first=self.ctx.global_step + lookahead)

    def start_from(self, caps: Caps, points: Sequence[tuple[int, int]]) -> tuple[int, ...] | None:
        """Caps measured before step 0 (``hetero.trainer.memprobe``), binding from the first
        step (identically on every rank); ``points``, this rank's ``(batch, peak bytes)`` as
        a step's, start the fit (GPU ranks), so the first boundary fits over three sizes."""
        if self.ctx.device.type == "cuda":
            self.points = list(points)
        self.measured = caps
        return self.update("memory probe", first=0)

    def learn(self, rank: int, cap: int) -> None:
        """Lower ``rank``'s cap after it ran out of memory (identically on every rank)."""
        learned = list(self.learned or (None,) * self.ctx.world_size)
        old = learned[rank]
        learned[rank] = cap if old is None else min(old, cap)
        self.learned = tuple(learned)

    def update(
        self, reason: str = "memory caps", first: int | None = None
    ) -> tuple[int, ...] | None:
        """Apply the combined caps if they changed, from step ``first`` (``apply_caps``)."""
        caps = combine(self.configured, self.measured, self.learned)
        if caps is None or caps == self.caps:
            return None
        self.caps = caps
        return apply_caps(self.ctx, caps, f"{reason} {list(caps)}", first)

    def _estimate(self) -> int | None:
        ctx = self.ctx
        mine = ctx.summaries[-1][ctx.rank]
        budget = budget_bytes(ctx.device, self.fraction)
        base = base_bytes(ctx.device)
        predicted = self.fit.peak_bytes(self._max_batch) if self.fit is not None else None
        if ctx.device.type == "cuda" and self._max_batch > 0:
            # On a CPU the peak is the process's peak RSS, which only grows: not a line in b.
            self.points = [*self.points, (self._max_batch, mine.peak_memory_bytes)][-_POINTS:]
            self.fit = fit_memory(self.points, base)
            cap = self.fit.cap(budget, self.margin) if self.fit is not None else None
        else:
            cap = cap_from(budget, base, mine.peak_memory_bytes, self._max_batch, self.margin)
        self.estimates.append(
            Estimate(
                ctx.global_step,
                budget,
                base,
                mine.peak_memory_bytes,
                self._max_batch,
                cap,
                predicted,
            )
        )
        return cap


def describe(caps: Sequence[int | None] | None) -> str:
    return (
        "none"
        if caps is None
        else "[" + ", ".join("-" if c is None else str(c) for c in caps) + "]"
    )
