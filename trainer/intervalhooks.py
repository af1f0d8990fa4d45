"""``ctx.on_interval(fn)``: every interval's figures, handed to any logger.

At each rebalance boundary, once the metrics record is written, each callback is
called with the interval's figures as a plain dict (numbers, strings, lists, dicts
and None; nothing of torch): on rank 0, or on every rank with ``every_rank=True``.
Every rank holds every rank's summary after the boundary's all-gather, so rank 0's
figures are the job's; a logger (W&B, MLflow, TensorBoard) wants one writer per job,
which rank 0 is. The fields:

- the job's, as in every metrics record (``trainer.metrics.JOB_FIELDS``): ``step``
  (global steps done), ``interval_wall_s`` (the interval's wall time, s),
  ``samples_per_s`` (all ranks' samples over it), ``loss`` (the mean loss over the
  interval's samples; None where ``ctx.backward``/``ctx.step`` saw none), ``plan``
  (per-rank batches of the interval), ``plan_changed``, ``next_plan`` and
  ``apply_at_step`` (the boundary's decision; None while the plan stays), ``reason``
  (why it changed or stayed; rank 0's, None on the others), ``not_helping`` (why
  balancing does not beat equal batches here, "" while it does; rank 0's), ``comm``
  and ``comm_reason`` (when the interval's gradient all-reduces started, and why the
  next interval's mode), ``emulated``;
- ``ranks``: per rank, what its metrics record holds of it (``trainer.metrics.
  rank_figures``): ``rank``, ``batch``, ``local_loss``, ``steps_measured``, ``compute_s``,
  ``per_sample_compute_s``, ``phases_s`` {data, forward, backward, comm, optimizer},
  ``step_s``, ``busy_s``, ``busy_cv``, ``switch_s``, ``switch_steps``, ``input_s``,
  ``input_cv``, ``peak_memory_bytes``, ``slowdown``, ``injected_s``, and ``max_batch`` (its memory cap
  in samples, None without one);
- ``gap``: this interval's gap breakdown (``hetero.core.gap``), or None where none can
  be made (an interval not measured): ``step_ms`` (its wall time per step),
  ``reference_ms`` (the ideal step where ``ctx.measure_ideal`` ran, else the ranks' own
  work), ``gap_ms``, ``critical_rank``, ``terms_ms`` (each term in ms per step, None where
  n/a: without the ideal, ``overlap`` and ``optimizer``) and ``ideal`` (whether the
  reference is the measured ideal).

A callback that raises is logged once, with its traceback, and called again at the
next boundary: a logger's hiccup never stops training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hetero.core.gap import breakdown
from hetero.trainer.metrics import JOB_FIELDS, rank_figures
from hetero.trainer.runsummary import intervals_of

if TYPE_CHECKING:
    from hetero.trainer.context import Context
    from hetero.trainer.exchange import RankSummary

log = logging.getLogger("hetero.trainer")

#: Intervals before the last one the breakdown sees (which ran a new plan, the usual
#: boundary cost): enough to tell, few enough to cost nothing per boundary.
_GAP_CONTEXT = 8

IntervalCallback = Callable[[dict[str, Any]], object]


class IntervalHooks:
    """The callbacks of one context, and the figures they get."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._callbacks: list[tuple[IntervalCallback, bool]] = []
        self._failed: set[int] = set()
        self._gap_failed = False

    def add(self, fn: IntervalCallback, every_rank: bool = False) -> None:
        self._callbacks.append((fn, every_rank))

    def after_interval(
        self, ctx: Context, summaries: list[RankSummary], record: dict[str, Any]
    ) -> None:
        """Call this rank's callbacks with the interval's figures (``record``: this rank's
        metrics record of it)."""
        mine = [fn for fn, every in self._callbacks if every or self.rank == 0]
        if not mine:
            return
        figures = interval_figures(ctx, summaries, record, self._gap(ctx))
        for fn in mine:
            try:
                fn(figures)
            except Exception as exc:  # a logger's failure must never stop training
                if id(fn) not in self._failed:
                    self._failed.add(id(fn))
                    log.warning(
                        "on_interval callback %s failed at step %d: %s (it is called again "
                        "at the next boundary; its further failures are not logged)",
                        getattr(fn, "__qualname__", repr(fn)),
                        figures["step"],
                        exc,
                        exc_info=True,
                    )

    def _gap(self, ctx: Context) -> dict[str, Any] | None:
        try:
            return interval_gap(ctx)
        except Exception as exc:  # arithmetic on odd figures: n/a, never a stopped run
            if not self._gap_failed:
                self._gap_failed = True
                log.warning("the interval's gap breakdown failed (n/a from now): %s", exc)
            return None


def interval_figures(
    ctx: Context,
    summaries: list[RankSummary],
    record: dict[str, Any],
    gap: dict[str, Any] | None,
) -> dict[str, Any]:
    """The figures of the module doc, from this rank's metrics record and every rank's
    summary of the interval."""
    caps = ctx.max_batch or (None,) * len(summaries)
    ranks = [{"rank": s.rank, **rank_figures(s), "max_batch": caps[s.rank]} for s in summaries]
    return {name: record.get(name) for name in JOB_FIELDS} | {"ranks": ranks, "gap": gap}


def interval_gap(ctx: Context) -> dict[str, Any] | None:
    """The breakdown of the interval that just ended (module doc), or None."""
    intervals = intervals_of(ctx, last=_GAP_CONTEXT + 1)
    if not intervals or intervals[-1].end_step != ctx.global_step:
        return None
    solos = ctx.solo if ctx.solo and len(ctx.solo) == ctx.world_size else None
    last = len(intervals) - 1
    bd = breakdown(intervals, solos, window=range(last, last + 1))
    if bd is None:
        return None
    return {
        "step_ms": bd.step_ms,
        "reference_ms": bd.reference_ms,
        "gap_ms": bd.gap_ms,
        "critical_rank": bd.critical_rank,
        "terms_ms": {t.name: t.ms_per_step for t in bd.terms},
        "ideal": bd.ideal_samples_per_s is not None,
    }
