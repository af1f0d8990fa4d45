"""Evaluations during training: run the user's function outside the step clocks, and keep
what it measured as a record of the run.

``Context.evaluate(fn)`` is collective in effect: every rank calls it at the
same step. ``fn`` runs on each rank (it may use collectives itself, or do its
work on rank 0 only and return ``{}`` elsewhere); a barrier then lets the ranks
leave together, so no rank's next step absorbs a peer's evaluation as input or
communication wait. The time it took is taken out of the interval's wall time
and the step clock restarts, so throughput, the balancer's statistics and the
gap breakdown see training only.

Rank 0's result becomes one record: appended to ``metrics/eval.jsonl`` (what
``hetero-top --run`` draws as curves), kept in ``ctx.evals`` (what the
TensorBoard writer adds as ``eval/<name>`` scalars) and returned.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hetero.core.errors import ConfigError

if TYPE_CHECKING:
    from hetero.trainer.context import Context

EvalFn = Callable[[], Mapping[str, Any] | None]


def evaluate(ctx: Context, fn: EvalFn) -> dict[str, float]:
    """Run ``fn`` on this rank, keep rank 0's numbers as an evaluation record, return them."""
    t0 = time.perf_counter()
    result = fn() or {}
    if not isinstance(result, Mapping):
        raise ConfigError(
            f"ctx.evaluate: the function returned {type(result).__name__}, not a mapping of "
            "metric names to numbers"
        )
    metrics = finite_numbers(result)
    ctx.barrier()
    elapsed = time.perf_counter() - t0
    # Training time only: the interval's wall clock and the next step's input wait.
    ctx._interval.started_s += elapsed
    ctx.clock.restart()
    if ctx.rank == 0:
        record = {
            "step": ctx.global_step,
            "time_s": time.time(),
            "eval_s": elapsed,
            "metrics": metrics,
        }
        ctx.evals.append(record)
        ctx.metrics.write_eval(record)
    return metrics


def finite_numbers(result: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``result`` by name; anything else is a one-line error."""
    out: dict[str, float] = {}
    for name, value in result.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"ctx.evaluate: metric names must be strings, got {name!r}")
        if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"ctx.evaluate: metric {name!r} is {value!r}, not a number")
        if math.isfinite(value):
            out[name] = float(value)
    return out
