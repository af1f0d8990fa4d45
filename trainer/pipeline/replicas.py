"""The data-parallel planner one level up: pipeline replicas as the plan's entries.

A stage's step time is its replica's (the stages wait on each other), so each rank
reports its own and a replica counts as fast as its slowest stage
(:func:`replica_summaries`); the planner then plans the replicas' shares in whole
microbatches (:class:`MicrobatchPlanner`), since every microbatch of a run has the same
samples (``trainer.pipeline.pipe``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hetero.core.balancer import Decision, History, Horizon
from hetero.core.pipeplan import Layout
from hetero.trainer.exchange import Planner, RankSummary


def replica_summaries(summaries: Sequence[RankSummary], layout: Layout) -> list[RankSummary]:
    """Each replica's interval as a rank's: its busiest stage's times (a replica is as fast
    as its slowest stage), its last stage's samples and loss (every stage draws the
    replica's samples; the last one computes the loss), the largest peak memory, and the
    replica as its rank. What the planner, the reports and the gap breakdown read."""
    out = []
    for k in range(layout.replicas):
        mine = [summaries[r] for r in layout.replica_ranks(k)]
        slowest = max(mine, key=lambda s: s.data_s + s.compute_s + s.optimizer_s)
        out.append(
            replace(
                slowest,
                rank=k,
                samples=mine[-1].samples,
                loss_sum=mine[-1].loss_sum,
                peak_memory_bytes=max(s.peak_memory_bytes for s in mine),
                lookahead=max(s.lookahead for s in mine),
            )
        )
    return out


@dataclass(frozen=True)
class MicrobatchPlanner:
    """A planner over replicas that plans in microbatches of ``microbatch`` samples: the
    history's and the plan's batches are divided by it on the way in and multiplied on
    the way out, so every plan gives each replica whole microbatches."""

    inner: Planner
    microbatch: int

    def decide(
        self, history: History, current: tuple[int, ...], horizon: Horizon | None = None
    ) -> Decision:
        mu = self.microbatch
        units = tuple(tuple(replace(r, batch=r.batch // mu) for r in iv) for iv in history)
        d = self.inner.decide(units, tuple(b // mu for b in current), horizon)
        return replace(d, batches=tuple(b * mu for b in d.batches))

    def close(self, *, failed: bool = False) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close(failed=failed)
