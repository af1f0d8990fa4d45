"""How many DataLoader worker processes a rank gets: in proportion to its share of its node.

A rank's loading work (decoding, augmenting, collating) is proportional to the
samples it draws per step, so a rank the planner gives twice the batch of its
neighbour needs about twice the workers to keep up, while the neighbour's
workers idle. The rule:

- the user's ``num_workers`` is the count per rank at an *equal* share, so the
  node's budget is ``num_workers × local ranks``: the same processes plain DDP
  would start on that node;
- rank *i* gets ``round(budget × b_i / Σ_local b)`` of it, at least 1 (a rank
  whose user asked for workers keeps loading off its training thread);
- the count changes only when the target has moved more than ``0.5 +
  hysteresis`` workers away from the current one: a new count means new worker
  processes (their start-up and the batches the old ones had prefetched are
  lost, once, like the start of an epoch), so a plan that wobbles around a
  rounding boundary must not restart them at every interval.

"Local" means the ranks on the same host, found once at init by an all-gather
of host identities (``trainer.bootstrap.local_peers``), not from launcher
numbering. Pure: plans and counts in, counts out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.errors import ConfigError


@dataclass(frozen=True)
class WorkerShare:
    """This rank's worker count under each plan. ``peers``: the ranks on its host,
    itself included."""

    num_workers: int
    peers: tuple[int, ...]
    rank: int
    hysteresis: float = 0.25

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.rank not in self.peers:
            raise ConfigError(f"rank {self.rank} is not among its node's ranks {self.peers}")
        if not 0.0 <= self.hysteresis < 1.0:
            raise ConfigError(f"worker hysteresis must be in [0, 1), got {self.hysteresis}")

    @property
    def budget(self) -> int:
        """Workers of the whole node: ``num_workers`` per local rank."""
        return self.num_workers * len(self.peers)

    def target(self, plan: Sequence[int]) -> float:
        """This rank's exact share of the node's budget under ``plan`` (workers)."""
        local = sum(plan[r] for r in self.peers)
        if local <= 0:
            return float(self.num_workers)
        return self.budget * plan[self.rank] / local

    def initial(self, plan: Sequence[int]) -> int:
        """The count to start with under ``plan``: the rounded target, at least 1."""
        if self.num_workers == 0:
            return 0
        return max(1, round(self.target(plan)))

    def next_count(self, plan: Sequence[int], current: int) -> int:
        """The count under ``plan`` for a rank running ``current`` workers: unchanged
        unless the target left ``current`` by more than ``0.5 + hysteresis``."""
        if self.num_workers == 0:
            return 0
        target = self.target(plan)
        if abs(target - current) <= 0.5 + self.hysteresis:
            return current
        return max(1, round(target))
