"""A rank's peak memory as a line in its batch: ``peak(b) = fixed + per_sample · b`` (bytes).

``fixed`` is what a step holds whatever its batch: parameters (or, sharded, the
rank's shards plus the largest unit gathered at once), gradients, optimizer
state, workspaces. ``per_sample`` is the activations one sample keeps for
backward. Both come from the peaks the trainer already records per interval
(``peak_memory_bytes`` at the largest batch the interval ran); no size is typed.

With peaks at two or more batch sizes the line is a least-squares fit over the
highest peak seen at each size (peaks are maxima, so the envelope is the
honest one). With one size only, ``fixed`` is the memory held between steps
(``floor_bytes``) and everything above it is counted per sample: the estimate
errs low, as ``hetero.trainer.memory`` always did. The cap is the largest batch
whose predicted peak stays under the budget less a safety ``margin``.

Before step 0 no interval has run, so the trainer's start-up probe
(``hetero.trainer.memprobe``) measures the peaks of forward and backward at two
small batches itself: :func:`probe_fit` draws the line through them,
:class:`ProbedRank` adds the optimizer state the first ``optimizer.step()``
will allocate (counted from the parameters, as no pass allocates it), and
:func:`probe_caps` turns each rank's line into the cap of its first plan.

Pure: the trainer and the planner's tests share it (no torch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetero.core.catalogue.training import TrainingOptions

GIB = 2**30


@dataclass(frozen=True)
class MemoryFit:
    """``peak(b) = fixed_bytes + per_sample_bytes · b``; ``sizes``: distinct batches fitted."""

    fixed_bytes: float
    per_sample_bytes: float
    sizes: int

    def peak_bytes(self, batch: int) -> float:
        """Predicted peak of a step at ``batch`` samples (bytes)."""
        return self.fixed_bytes + self.per_sample_bytes * batch

    def cap(self, budget_bytes: float, margin: float) -> int:
        """The largest batch whose predicted peak is at most ``budget · (1 − margin)``;
        0 when not even the fixed part fits."""
        room = budget_bytes * (1.0 - margin) - self.fixed_bytes
        if room <= 0:
            return 0
        return int(room // self.per_sample_bytes) if self.per_sample_bytes > 0 else 2**31 - 1

    def fits_state(self, budget_bytes: float, margin: float) -> bool:
        """Whether the fixed part alone fits (a device that cannot hold its shards)."""
        return self.fixed_bytes <= budget_bytes * (1.0 - margin)


def fit_memory(points: Sequence[tuple[int, int]], floor_bytes: int) -> MemoryFit | None:
    """The line through ``points`` (``(batch, peak_bytes)`` per interval); ``None`` when no
    point rises above ``floor_bytes`` (nothing measurable, e.g. a CPU whose peak RSS
    predates the intervals)."""
    top: dict[int, int] = {}
    for batch, peak in points:
        if batch > 0:
            top[batch] = max(top.get(batch, 0), peak)
    if not top:
        return None
    if len(top) >= 2:
        n = len(top)
        mean_b = sum(top) / n
        mean_p = sum(top.values()) / n
        var = sum((b - mean_b) ** 2 for b in top)
        slope = sum((b - mean_b) * (p - mean_p) for b, p in top.items()) / var
        intercept = mean_p - slope * mean_b
        if slope > 0 and intercept >= 0:
            # No point may sit above the line: peaks are maxima, a cap below them is unsafe.
            lift = max(p - (intercept + slope * b) for b, p in top.items())
            return MemoryFit(intercept + max(lift, 0.0), slope, n)
    batch = max(top)
    per_sample = (top[batch] - floor_bytes) / batch
    if per_sample <= 0 or not math.isfinite(per_sample):
        return None
    return MemoryFit(float(floor_bytes), per_sample, 1)


def sharded_state_bytes(
    parameters: int, world_size: int, *, shard: str, bytes_per_param: int = 16
) -> float:
    """Bytes of training state per rank before activations: ``bytes_per_param`` (16 for
    fp32 AdamW: 4 parameter, 4 gradient, 8 optimizer) per parameter, divided over the
    ranks under ``grad_op`` (all but the 4-byte parameter) or ``full`` (all of it);
    replicated under ``none``. Gathered units and workspaces come on top (measured)."""
    if shard == "full":
        return parameters * bytes_per_param / world_size
    if shard == "grad_op":
        return parameters * (4 + (bytes_per_param - 4) / world_size)
    return float(parameters * bytes_per_param)


def state_bytes_of(options: TrainingOptions, world_size: int) -> float | None:
    """Predicted training state per rank of a built-in job on the device (bytes), from
    its model's parameter count and optimizer: ``None`` when none of it stays on the
    device (``offload`` params) or the model's size is unknown."""
    from hetero.core.catalogue.entries import model

    parameters = model(options.model).parameters
    if options.offload != "none" or parameters <= 0:
        return None
    per_param = 16 if options.optimizer_kind == "adamw" else 12  # SGD: one momentum buffer
    return sharded_state_bytes(
        parameters, world_size, shard=options.shard, bytes_per_param=per_param
    )


@dataclass(frozen=True)
class ProbedRank:
    """What one rank's start-up probe found (bytes): the line through its peaks at the
    probe's batches, the optimizer state its first step will add, and its limit."""

    rank: int
    device: str
    fit: MemoryFit
    optimizer_bytes: float
    budget_bytes: float

    def peak_bytes(self, batch: int) -> float:
        """Predicted peak of a training step at ``batch``: the probe's line plus the
        optimizer state no pass of the probe allocated."""
        return self.fit.peak_bytes(batch) + self.optimizer_bytes

    def cap(self, margin: float) -> int:
        """The largest batch whose predicted peak stays under ``budget · (1 − margin)``."""
        whole = MemoryFit(self.fit.fixed_bytes + self.optimizer_bytes, self.fit.per_sample_bytes, 2)
        return whole.cap(self.budget_bytes, margin)


def probe_fit(points: Sequence[tuple[int, int]]) -> MemoryFit | None:
    """The line through the probe's ``(batch, peak_bytes)`` points, or ``None`` when they
    do not rise with the batch (nothing per sample to measure). Unlike :func:`fit_memory`
    there is no floor to fall back on: the probe's points are the whole evidence."""
    fit = fit_memory(points, floor_bytes=0)
    return fit if fit is not None and fit.sizes >= 2 else None


#: Two consecutive segments of the probe's peaks whose slopes differ by less than this
#: (relative) lie on one line: the probe stops doubling there.
STRAIGHT = 0.1


def probe_line_bends(points: Sequence[tuple[int, int]]) -> bool:
    """Whether the probe's ``(batch, peak_bytes)`` points (batches doubling) still bend,
    so that the probe should double the batch again.

    A pass's peak is the largest over its moments of ``fixed_t + a_t·b`` (what each
    moment holds): convex in ``b``, so a line through two small batches under-predicts
    larger ones where a moment whose activations grow faster takes over (GPT-2 medium
    with recomputation on 2× H100: flat up to 4 samples, then 0.27 GB a sample; the line
    through 2 and 4 said 88 MB a sample). The points bend while the last segment is
    flat, is the only one, or is steeper than the one before by more than ``STRAIGHT``."""
    if len(points) < 2:
        return False
    (b1, p1), (b2, p2) = points[-2], points[-1]
    last = (p2 - p1) / (b2 - b1)
    if last <= 0 or len(points) < 3:
        return True
    b0, p0 = points[-3]
    return last > (p1 - p0) / (b1 - b0) * (1 + STRAIGHT)


def probe_pass_fits(points: Sequence[tuple[int, int]], floor_bytes: float, limit: float) -> bool:
    """Whether a pass at twice the last point's batch cannot exceed ``limit`` bytes. Every
    moment of a pass holds at least ``floor_bytes`` (allocated before it), so each
    moment's ``a_t <= (peak(b) - floor) / b`` and ``peak(2b) <= 2·peak(b) - floor``:
    a bound, not a guess, whatever the model."""
    return not points or 2 * points[-1][1] - floor_bytes <= limit


def probe_caps(ranks: Sequence[ProbedRank], margin: float, min_batch: int) -> tuple[int, ...]:
    """Every probed rank's cap, in the order given; a ``PlanError`` naming the first rank
    whose memory cannot hold ``min_batch``, its device, its limit and the predicted need."""
    from hetero.core.errors import PlanError

    caps = []
    for r in ranks:
        cap = r.cap(margin)
        if cap < min_batch:
            raise PlanError(
                f"memory probe: rank {r.rank} ({r.device}) cannot hold min_batch {min_batch}: "
                f"predicted {r.peak_bytes(min_batch) / GIB:.2f} GiB at that batch, over "
                f"its limit {r.budget_bytes * (1 - margin) / GIB:.2f} GiB "
                f"({r.budget_bytes / GIB:.2f} GiB less the {margin:.0%} margin)"
            )
        caps.append(cap)
    return tuple(caps)


# ---- activation checkpointing: which ranks recompute ----------------------------------------

#: A step's compute with activation checkpointing over one without: each block's forward
#: runs again in backward, and a forward is about a third of forward and backward.
RECOMPUTE_SLOWDOWN = 4 / 3


def capped_step_time(caps: Sequence[int | None], wanted: Sequence[int]) -> float:
    """The step time of the best plan under ``caps``, relative to the uncapped plan
    ``wanted`` (1.0: no cap binds; ``inf``: the caps cannot hold the global batch).

    ``wanted`` is the speed plan: rank i's share is taken as proportional to its speed,
    so a rank runs ``T · wanted[i]`` samples in relative time ``T``. Water-filling: the
    capped ranks run their caps and the others share the rest in proportion."""
    total = sum(wanted)
    capped: set[int] = set()
    while True:
        free = sum(w for i, w in enumerate(wanted) if i not in capped)
        held = sum(caps[i] or 0 for i in capped)
        if free <= 0:
            return 1.0 if held >= total else math.inf
        t = max((total - held) / free, 1.0)
        over = {
            i
            for i, (c, w) in enumerate(zip(caps, wanted, strict=True))
            if i not in capped and c is not None and c < t * w
        }
        if not over:
            return t
        capped |= over


def recompute_wanted(
    caps: Sequence[int | None],
    wanted: Sequence[int],
    min_batch: int,
    slowdown: float = RECOMPUTE_SLOWDOWN,
) -> tuple[bool, ...]:
    """Which ranks should turn activation checkpointing on, from the memory caps found
    without it (``None``: no cap) and the first plan's shares ``wanted``.

    Rank i turns it on when its cap cannot hold ``min_batch``, or when its cap holds it
    below the share it would run in the capped plan's step time even at the slower
    speed checkpointing brings: ``cap < T · wanted[i] / slowdown``, ``T`` being
    :func:`capped_step_time`. A rank whose cap binds only a little keeps its speed: at a
    third more compute per sample it would run fewer samples in that time than its cap
    already allows, and the step would not get shorter."""
    t = capped_step_time(caps, wanted)
    return tuple(
        c is not None and (c < min_batch or (c < w and c < t * w / slowdown))
        for c, w in zip(caps, wanted, strict=True)
    )
