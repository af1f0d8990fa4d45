"""Throughput of a job from one interval's per-rank statistics: measured, `equal`, ideal.

Pure: the servicer turns stored rows into ``RankPhases`` and calls
``estimate``. The three numbers answer the operator's question "how much did
balancing buy, and how much is left":

- *measured*: the global batch over the slowest rank's mean wall seconds per
  step (every rank waits for the slowest in the all-reduce, so the max is the
  job's step time);
- *equal*: what plain DDP (``B/W`` samples per rank) would do on the same
  ranks: the slowest per-sample compute time times ``B/W``, plus the per-step
  overhead the interval measured outside compute (all-reduce, optimizer,
  data), which does not depend on the split;
- *ideal*: the yardstick of ``docs/design.md``, Σ over ranks of each rank's standalone
  throughput at its batch; standalone time is the rank's wall step time less
  its wait for peers (or its compute time when the wait was not measured).

Every per-rank time is seconds per step; a rank that ran no step is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankPhases:
    """One rank's means per step over one interval, in seconds (None = not measured)."""

    rank: int
    batch: int
    steps: int
    compute_s: float
    step_s: float
    comm_wait_s: float | None = None
    loss_sum: float | None = None
    samples: int | None = None


@dataclass(frozen=True)
class Throughput:
    """Samples per second; None where the interval does not say (no step ran)."""

    samples_per_s: float | None
    equal_samples_per_s: float | None
    ideal_samples_per_s: float | None
    #: Mean loss over the interval's samples of every rank that reported one.
    loss: float | None


def estimate(ranks: Sequence[RankPhases], global_batch: int) -> Throughput:
    ran = [r for r in ranks if r.steps > 0 and r.batch > 0 and r.step_s > 0]
    if not ran or global_batch <= 0:
        return Throughput(None, None, None, _loss(ranks))
    step_s = max(r.step_s for r in ran)
    measured = global_batch / step_s
    equal = None
    if all(r.compute_s > 0 for r in ran) and len(ran) == len(ranks):
        # Overhead outside compute is per step, the same whatever the split.
        overhead_s = max(0.0, step_s - max(r.compute_s for r in ran))
        slowest_per_sample_s = max(r.compute_s / r.batch for r in ran)
        equal = global_batch / (slowest_per_sample_s * global_batch / len(ranks) + overhead_s)
    ideal = 0.0
    for r in ran:
        alone_s = r.step_s - r.comm_wait_s if r.comm_wait_s is not None else r.compute_s
        # Never faster than its own compute, whatever a skewed wait measurement says.
        ideal += r.batch / max(alone_s, r.compute_s, 1e-9)
    return Throughput(measured, equal, ideal, _loss(ranks))


def _loss(ranks: Sequence[RankPhases]) -> float | None:
    reported = [r for r in ranks if r.loss_sum is not None and r.samples]
    samples = sum(r.samples or 0 for r in reported)
    if not samples:
        return None
    return sum(r.loss_sum or 0.0 for r in reported) / samples
