"""Where a stream's pass ends: the ranks agree on the first step some rank cannot fill.

A rank learns that its part of a stream ran out only when a reader of it fails to
fill a step (``trainer.stream``). Every rank must stop at the same step, or the ranks
that go on wait in the gradient all-reduce for one that left. An unsized stream (a
generator, a WebDataset or Hugging Face stream) tells no rank in advance where any
part ends, and where the dataset splits its files between DataLoader workers no part
of a rank has a length the rank could know, so the ranks must tell one another. What
this costs per step is the question; torch's ``Join`` for uneven inputs pays one
blocking all-reduce per step.

Here each rank reads ``2P − 1`` steps ahead of the step it hands out (the batches, made
by its readers, wait on the host), and every ``P`` steps it issues a non-blocking
all-reduce (MIN) on a Gloo group of its own of the last step it has read (infinite once
its part ran out), the first step it could not fill (infinite while none), and that
step with its rank (which names the lowest rank that ran out first, for the log). It
waits for that result ``P`` steps later, when issuing the next: by then it covers every
step until the next wait, so all ranks hand out a step only once all have read it, and
stop at the first step one could not fill, reading the same results at the same steps.
Should a wait find a step not yet covered (a pass's first step, or a period that grew),
it issues and waits for one at once: every decision depends only on agreed values, so
the ranks take it at the same steps. ``P`` is the steps in :data:`PERIOD_S` at the
slowest rank's pace of the last interval (at most :data:`MAX_PERIOD`): the read-ahead
holds up to 100 ms of batches (15 at most), and a plan scheduled at a boundary applies
that much later (the loader's ``lookahead`` counts it). The group is Gloo on CPU
whatever the job's backend: three integers on the host, no GPU stream touched.

``python -m hetero.bench.stream_agree --nproc 2 --steps 600`` on a 2-core CPU host at
load 4 to 7 (DebugNet, global batch 48, median steps of 3 to 5 ms, so a period of 8):
``agree`` takes 2 µs at the median step and 0.15 to 0.19 ms on average (the waits of a
pass's first step, and the scheduling tails of that load), with 0.21 all-reduces per
step. Agreeing at every step (``--every-step``) takes 0.21 to 0.37 ms at the median (the
Gloo enqueue) and 0.61 to 0.73 ms on average: why the agreements are paced. One rank
agrees with itself, with no read-ahead and no collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from hetero.trainer.exchange import RankSummary

#: Infinite, as the agreement's integers spell it.
NEVER = 2**62
#: Seconds of steps between two agreements.
PERIOD_S = 0.05
#: Most steps between two agreements (the read-ahead is twice that, less one).
MAX_PERIOD = 8


class PassEnds:
    """The ranks' agreement on where a stream's pass ends. Create it on every rank
    (collective: it makes a Gloo group when ``world_size > 1``); per pass, call
    :meth:`start` then, for each step in turn, :meth:`pace`, read ahead
    :meth:`read_ahead` steps, and :meth:`agree`."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self._group: Any = dist.new_group(backend="gloo") if world_size > 1 else None
        #: Steps between agreements.
        self.period = 1
        #: The last step every rank has read, the first step one could not fill, and the
        #: lowest rank that could not fill it (agreed values).
        self.covered = -1
        self.end = NEVER
        self.short_rank = -1
        #: All-reduces issued (every rank issues the same).
        self.rounds = 0
        self._next_poll = 0
        self._pending: tuple[Any, torch.Tensor] | None = None

    def start(self, step: int) -> None:
        """A pass begins at ``step``: forget the last one's agreement (every rank has the
        same one in flight, if any)."""
        self._wait()
        self.covered, self.end, self.short_rank, self._next_poll = step - 1, NEVER, -1, step

    def read_ahead(self) -> int:
        """Steps to have read beyond the one to hand out."""
        return 0 if self._group is None else 2 * self.period - 1

    def pace(self, step: int, summaries: Sequence[Sequence[RankSummary]]) -> None:
        """At an agreement's step, before reading ahead: the period from the slowest rank's
        pace in the last interval (the same summaries on every rank at the same step)."""
        if step != self._next_poll or not summaries:
            return
        step_s = max(s.step_s for s in summaries[-1])
        self.period = min(MAX_PERIOD, max(1, int(PERIOD_S / step_s))) if step_s > 0 else 1

    def agree(self, step: int, read: int, short: int | None) -> bool:
        """Whether every rank hands out ``step`` (False: the pass ends there). ``read``:
        the last step this rank has read, at least ``step`` unless ``short``, the first
        step it could not fill. Collective."""
        if self._group is None:
            if short is not None and short <= step:
                self.end, self.short_rank = short, self.rank
            return short is None or step < short
        mine = (
            (NEVER, short, short * self.world_size + self.rank)
            if short is not None
            else (read, NEVER, NEVER)
        )
        if step == self._next_poll:
            self._wait()
            self._issue(mine)
            self._next_poll = step + self.period
        while step > self.covered and step < self.end:
            if self._pending is None:
                self._issue(mine)
            self._wait()
        return step < self.end

    def _issue(self, mine: tuple[int, int, int]) -> None:
        values = torch.tensor(mine, dtype=torch.int64)
        work = dist.all_reduce(values, op=dist.ReduceOp.MIN, group=self._group, async_op=True)
        self._pending = (work, values)
        self.rounds += 1

    def _wait(self) -> None:
        if self._pending is None:
            return
        work, values = self._pending
        self._pending = None
        work.wait()
        read, end, who = (int(v) for v in values.tolist())
        self.covered = max(self.covered, read)
        if end < self.end:
            self.end, self.short_rank = end, who % self.world_size
        elif end == self.end and end < NEVER:
            self.short_rank = min(self.short_rank, who % self.world_size)

    def close(self, *, failed: bool = False) -> None:
        """Release the group; the all-reduce in flight is waited for unless ``failed``
        (this rank stops on an error, its peers may be gone)."""
        if self._pending is not None and not failed:
            self._pending[0].wait()
        self._pending = None
        self._group = None
