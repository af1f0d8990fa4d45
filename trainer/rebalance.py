"""The rebalance protocol, run by every rank at each boundary (``rebalance_interval``
steps): summarize this rank's interval, all-gather the summaries, decide the next
plan and the next interval's comm mode on rank 0, broadcast them, and schedule
the plan on every rank at the same step (the mode applies from the next step); then
write the interval's metrics record and hand its figures to the user's callbacks
(``trainer.intervalhooks``).

The collectives are ``trainer.exchange``'s; the state (history, summaries, plans)
lives on the ``Context``, which these functions advance.
"""

from __future__ import annotations

import logging
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hetero.core import replan
from hetero.core.errors import DistributedError
from hetero.trainer.commsched import AUTO, CommRecord
from hetero.trainer.exchange import (
    EmbeddedPlanner,
    PlanDecision,
    RankSummary,
    all_gather_summaries,
    broadcast_plan,
)
from hetero.trainer.gradients import DEFERRED, OVERLAP
from hetero.trainer.metrics import interval_record, run_info
from hetero.trainer.timing import StepTimes

if TYPE_CHECKING:
    from hetero.trainer.context import Context

log = logging.getLogger("hetero.trainer")
#: HETERO_DEBUG_TIMING=1 logs every step's phase times at each interval boundary.
_DEBUG_TIMING = os.environ.get("HETERO_DEBUG_TIMING") == "1"


@dataclass
class PlanRecord:
    """A plan change as all ranks applied it."""

    version: int
    apply_at_step: int
    batches: tuple[int, ...]
    reason: str


@dataclass
class IntervalTotals:
    """Accumulators of the interval in progress."""

    started_s: float = field(default_factory=time.perf_counter)
    loss_sum: torch.Tensor | None = None
    samples: int = 0
    global_samples: int = 0


def rebalance(ctx: Context) -> None:
    """At a boundary, on every rank: exchange the interval's summaries, schedule the plan
    rank 0 decided, write this rank's metrics record, and start the next interval."""
    loader = ctx._require_loader()
    times = ctx._early_times + ctx.clock.resolve()
    ctx._early_times, ctx._recheck_at = [], None
    if _DEBUG_TIMING:
        for t in times:
            print(f"rank {ctx.rank} step timing {t}", file=sys.stderr, flush=True)
    mine = summarize(ctx, times)
    if loader.input_times is not None:
        loader.input_times.forget_before(ctx.global_step)
    try:
        summaries = all_gather_summaries(mine, ctx.world_size, ctx.device)
    except RuntimeError as exc:
        raise DistributedError(f"stats exchange at step {ctx.global_step} failed: {exc}") from None
    summaries = per_plan_entry(ctx, summaries)
    wall_s = time.perf_counter() - ctx._interval.started_s
    ran = ctx.comm_mode
    # Under comm="auto" only deferred intervals are planned from: in overlap a rank's
    # compute grows into its slack (trainer/commsched.py).
    if all(s.steps > 0 for s in summaries) and (ctx.comm_choice != AUTO or ran != OVERLAP):
        ctx.history.append(tuple(s.to_interval() for s in summaries))
    # Before deciding: a planner under an agent reports this interval's summaries.
    ctx.summaries.append(summaries)
    current = ctx.plan
    decision: PlanDecision | None = None
    reason = comm = comm_reason = ""
    if ctx.rank == 0:
        depth = max(s.lookahead for s in summaries)
        decision, reason, settled = decide(ctx, current, depth)
        comm, comm_reason = next_comm(ctx, summaries, decision[0], settled)
    try:
        changed, version, apply_at, plan, recheck, comm = broadcast_plan(
            decision, comm or None, ctx.world_size, ctx.device, entries=ctx.dp_size
        )
    except RuntimeError as exc:
        raise DistributedError(f"plan broadcast at step {ctx.global_step} failed: {exc}") from None
    if changed:
        loader.sampler.set_plan(plan, apply_at)
        ctx.plans.append(PlanRecord(version, apply_at, plan, reason))
        at = apply_at + ctx.config.settle_steps + recheck
        if recheck > 0 and at < ctx.global_step + ctx.config.rebalance_interval:
            ctx._recheck_at = at
    if ctx.comm_mode is not None and comm != ran:
        ctx.weighting.mode = comm
        ctx.comm_changes.append(CommRecord(ctx.global_step, comm, comm_reason))
    ctx.interval_walls.append(wall_s)
    ctx.interval_comm.append(ran)
    gpu = ctx.gpu.take() if ctx.gpu is not None else None
    record = interval_record(ctx, summaries, mine, wall_s, changed, plan, apply_at, reason, gpu)
    record.update(comm=ran, comm_reason=comm_reason if ctx.rank == 0 else None)
    ctx.metrics.write(record)
    if len(ctx.summaries) == 1:
        ctx.metrics.write_run(run_info(ctx))
    ctx.interval_hooks.after_interval(ctx, summaries, record)
    ctx._interval = IntervalTotals()
    ctx.clock.restart()


def recheck(ctx: Context) -> None:
    """Within an interval, on every rank: the planner asked to see its move at once
    (``Decision.recheck_steps``, a move on one interval of a rank's new speed). Exchange
    the settled steps of the new plan so far, let rank 0 decide again, schedule its
    answer; no metrics record (the boundary writes the interval's). The steps stay for
    the boundary's summary; so that they count once, the re-check's interval stays in
    the history only if the plan moved (the boundary then measures the new plan)."""
    loader = ctx._require_loader()
    ctx._early_times.extend(ctx.clock.resolve())
    ctx._recheck_at = None
    mine = summarize(ctx, ctx._early_times, reset_peak=False)
    try:
        summaries = all_gather_summaries(mine, ctx.world_size, ctx.device)
    except RuntimeError as exc:
        raise DistributedError(f"stats exchange at step {ctx.global_step} failed: {exc}") from None
    summaries = per_plan_entry(ctx, summaries)
    measured = all(s.steps > 0 for s in summaries) and (
        ctx.comm_choice != AUTO or ctx.comm_mode != OVERLAP
    )
    if measured:
        ctx.history.append(tuple(s.to_interval() for s in summaries))
    decision: PlanDecision | None = None
    reason = ""
    if ctx.rank == 0:
        depth = max(s.lookahead for s in summaries)
        decision, reason, _ = decide(ctx, ctx.plan, depth) if measured else _keep(ctx)
        decision = (*decision[:4], 0)  # one re-check per move on a new speed
    try:
        changed, version, apply_at, plan, _, _ = broadcast_plan(
            decision, ctx.comm_mode or DEFERRED, ctx.world_size, ctx.device, entries=ctx.dp_size
        )
    except RuntimeError as exc:
        raise DistributedError(f"plan broadcast at step {ctx.global_step} failed: {exc}") from None
    if changed:
        loader.sampler.set_plan(plan, apply_at)
        ctx.plans.append(PlanRecord(version, apply_at, plan, f"re-check: {reason}"))
        log.info("step %d: re-check moved the plan to %s (%s)", ctx.global_step, plan, reason)
    elif measured:
        ctx.history.pop()
    ctx.clock.restart()


def per_plan_entry(ctx: Context, summaries: list[RankSummary]) -> list[RankSummary]:
    """The interval as the plan's entries ran it: each rank's, or under pipeline stages
    each replica's (``trainer.pipeline.wrap.replica_summaries``). Everything after the
    exchange (the planner, the records, the reports) reads these."""
    if ctx.layout is None:
        return summaries
    from hetero.trainer.pipeline.replicas import replica_summaries

    return replica_summaries(summaries, ctx.layout)


def _keep(ctx: Context) -> tuple[PlanDecision, str, bool]:
    version = ctx.plans[-1].version
    return (False, version, ctx.global_step, ctx.plan, 0), "nothing to re-check", True


def summarize(ctx: Context, times: list[StepTimes], *, reset_peak: bool = True) -> RankSummary:
    """This rank's interval: steps at the current batch, after it has settled.

    The first ``settle_steps`` steps at a new batch size are left out: new
    shapes cost allocator and kernel-selection work once, and on GPUs that
    made every rank look ~15% slower for the interval right after each plan
    change. What they cost beyond the settled steps is the rank's switching
    cost (``switch_s``), which the balancer weighs against a plan change's
    gain. It is busy time, input wait included, so on the DataLoader path a
    first batch at the new size that waits for the workers is in it. Compute and
    step time are medians, robust to a stray slow step (a page fault, a
    collector pause); phases are means. ``input_s`` is what the DataLoader's
    workers need per batch of the current size, from the same steps' batches,
    and ``input_cv`` how much those batches' times spread (``trainer.inputrate``).
    ``reset_peak``: start the next peak-memory measurement (not at a re-check, whose
    steps the boundary's summary counts again).
    """
    valid = [t for t in times if t.step >= ctx.stats_from_step]
    current = ctx._step_sizes[ctx.dp_rank]
    sel = [t for t in valid if t.batch == current]
    settle_end = ctx._batch_since + ctx.config.settle_steps
    settled = [t for t in sel if t.step >= settle_end]
    switch_s = _switch_s(ctx, [t for t in sel if t.step < settle_end], settled)
    if switch_s is None and not ctx.summaries:
        switch_s = _first_size_s(ctx, times, settled)
    sel = settled or sel
    n = len(sel)
    loader = ctx._require_loader()
    input_s, input_cv = loader.input_rate([t.step for t in sel], current)

    def mean(attr: str) -> float:
        return sum(getattr(t, attr) for t in sel) / n if n else 0.0

    def median(attr: str) -> float:
        return statistics.median(getattr(t, attr) for t in sel) if n else 0.0

    loss_sum = float(ctx._interval.loss_sum.item()) if ctx._interval.loss_sum is not None else 0.0
    if ctx.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(ctx.device)
        if reset_peak:
            torch.cuda.reset_peak_memory_stats(ctx.device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return RankSummary(
        rank=ctx.rank,
        batch=current,
        steps=n,
        compute_s=median("compute_s"),
        step_s=median("step_s"),
        data_s=mean("data_s"),
        forward_s=mean("forward_s"),
        backward_s=mean("backward_s"),
        comm_s=mean("comm_s"),
        optimizer_s=mean("optimizer_s"),
        injected_s=mean("injected_s"),
        loss_sum=loss_sum,
        samples=ctx._interval.samples,
        peak_memory_bytes=peak,
        slowdown=ctx.slowdown_at(ctx.global_step - 1),
        switch_s=switch_s,
        busy_cv=_spread([_busy_s(t) for t in sel]),
        lookahead=loader.lookahead,
        input_s=input_s,
        input_cv=input_cv,
    )


def _busy_s(t: StepTimes) -> float:
    return t.data_s + t.compute_s + t.optimizer_s


def _spread(values: list[float]) -> float | None:
    """Robust relative spread of ``values`` (1.4826·MAD over the median); None below 3."""
    if len(values) < 3:
        return None
    mid = statistics.median(values)
    if mid <= 0:
        return None
    return 1.4826 * statistics.median(abs(v - mid) for v in values) / mid


def _switch_s(ctx: Context, settling: list[StepTimes], settled: list[StepTimes]) -> float | None:
    """Seconds the ``settling`` steps (the first at a new batch size) were busy beyond
    the settled steps' median, in all; None when the batch did not change in this
    interval after statistics began (the run's first size: ``_first_size_s``) or no
    settled step measures the baseline."""
    if (
        not settling
        or not settled
        or not ctx._batch_switched
        or ctx._batch_since < ctx.stats_from_step
    ):
        return None
    base = statistics.median(_busy_s(t) for t in settled)
    return max(sum(_busy_s(t) - base for t in settling), 0.0)


def _first_size_s(ctx: Context, times: list[StepTimes], settled: list[StepTimes]) -> float | None:
    """What this process's first batch size cost its first steps (the warm-up steps,
    before statistics begin): their compute and optimizer time beyond the settled
    steps' median, in all; None without both.

    A batch size new to the process costs what a plan change to a new size costs:
    cuDNN builds (and for some engines compiles) a plan per convolution and shape,
    the allocator grows. Measured here before any plan change, it is the balancer's
    cold switching cost from the first interval on (``payback.switch_costs``), so
    the first move pays for what it will really cost: on 2x H200, ConvNeXt-T's
    first step at a new size took 2.5-3.1 s against 30-60 ms warm, ResNet-50's
    0.17-0.20 s against 22-40 ms, where the prior of one step let two moves cost a
    neighbour's whole 100-step phase. Input wait is left out: the loader's first
    batches wait for its workers to start, once, at no plan change."""
    current = ctx._step_sizes[ctx.dp_rank]
    warm = [t for t in times if t.step < ctx.stats_from_step and t.batch == current]
    if not warm or not settled:
        return None
    base = statistics.median(t.compute_s + t.optimizer_s for t in settled)
    return max(sum(t.compute_s + t.optimizer_s - base for t in warm), 0.0)


def next_comm(
    ctx: Context, summaries: list[RankSummary], plan_changed: bool, settled: bool = True
) -> tuple[str, str]:
    """Rank 0 only: the comm mode of the next interval and why (``DEFERRED`` without DDP).
    ``settled``: the planner's (``Decision.settled``)."""
    if ctx.comm_mode is None:
        return DEFERRED, ""
    measured = all(s.steps > 0 for s in summaries)
    batches = tuple(s.batch for s in summaries) if measured else None
    step_s = max(s.step_s for s in summaries) if measured else None
    # What overlap may hide: the slowest rank's all-reduce after its backward (the others
    # wait for it there too), up to that backward, which overlap runs it beside.
    slowest = max(summaries, key=lambda s: s.compute_s) if measured else None
    hideable_s = min(slowest.comm_s, slowest.backward_s) if slowest is not None else None
    return ctx.comm.next_mode(batches, step_s, plan_changed, settled=settled, hideable_s=hideable_s)


def decide(ctx: Context, current: tuple[int, ...], depth: int) -> tuple[PlanDecision, str, bool]:
    """Rank 0 only: the decision, why, and whether the planner counts the plan as
    settled (``Decision.settled``). Never raises: a failing planner keeps the current
    plan. A new plan applies ``depth`` steps after the boundary (the ranks' loader
    lookahead)."""
    version = ctx.plans[-1].version
    if not ctx.history or ctx.planner is None:
        return (False, version, ctx.global_step, current, 0), "no complete interval yet", True
    horizon = replan.horizon(ctx.config.rebalance_interval, ctx.global_step, ctx.total_steps)
    try:
        d = ctx.planner.decide(tuple(ctx.history), current, horizon)
    except Exception as exc:  # the control plane must never stop training
        log.warning("planner failed at step %d, keeping the plan: %s", ctx.global_step, exc)
        return (False, version, ctx.global_step, current, 0), f"planner failed: {exc}", True
    if d.not_helping != ctx.not_helping and d.not_helping:
        log.warning("step %d: hetero is not helping here: %s", ctx.global_step, d.not_helping)
    ctx.not_helping = d.not_helping
    if not d.changed or tuple(d.batches) == current:
        return (False, version, ctx.global_step, current, 0), d.reason, d.settled
    apply_at = ctx.global_step + depth
    # Only the embedded planner re-checks: a coordinator's plans follow its own reports,
    # one per boundary.
    again = d.recheck_steps if isinstance(ctx.planner, EmbeddedPlanner) else 0
    return (True, version + 1, apply_at, tuple(d.batches), again), d.reason, False
