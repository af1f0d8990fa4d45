"""``HeteroLoader``: one epoch of this rank's share of each global batch, on its device.

The uneven sampler (``trainer.sampler``) cuts each global batch by the plan in
force at that step; the loader tells the context each step's sizes (the
gradient weighting) and keeps its position for checkpoints.

Through a ``DataLoader`` it also copies the next batch to a CUDA device while
this one computes (``trainer.prefetch``) and gives the rank DataLoader workers
in proportion to its share of its node (``trainer.workerscale``): when a new
plan moves the rounded count, the DataLoader's iterator is rebuilt with the
new count at the step that plan applies from. The sampler is a pure function
of (epoch, step, plans), so the rebuilt iterator continues the same order:
no sample is dropped or repeated.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset, default_collate

from hetero.trainer.prefetch import device_batches, to_device
from hetero.trainer.sampler import UnevenBatchSampler
from hetero.trainer.workerscale import WorkerShare

if TYPE_CHECKING:
    from hetero.trainer.context import Context


class HeteroLoader:
    """Iterates one epoch of this rank's batches, already on the rank's device; the
    next iteration continues where the last one stopped (a loop that breaks early
    loses no batch).

    Datasets with a ``get_batch(indices, device)`` method are gathered directly
    (fast, no worker processes); others go through a ``DataLoader`` whose
    ``batch_sampler`` is the uneven sampler. Plan changes are scheduled after
    the steps the loaders have already drawn (``lookahead``, gathered from every
    rank at each boundary).

    ``share`` (None: a fixed ``num_workers``) sets the worker count per plan;
    ``worker_counts`` lists ``(global step, count)`` from the first step on.
    """

    def __init__(
        self,
        ctx: Context,
        dataset: Dataset[Any],
        sampler: UnevenBatchSampler,
        *,
        num_workers: int,
        prefetch_factor: int,
        pin_memory: bool,
        share: WorkerShare | None = None,
    ) -> None:
        self.ctx = ctx
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.share = share
        self.fast = hasattr(dataset, "get_batch") and num_workers == 0
        #: Worker processes of the DataLoader now (0 on the ``get_batch`` path).
        self.workers = share.initial(sampler.current_batches()) if share else num_workers
        self.worker_counts: list[tuple[int, int]] = [(sampler.global_step, self.workers)]
        self._consumed = (sampler.epoch, sampler.step_in_epoch, sampler.global_step)
        #: The DataLoader path's batches on the device, from the next step to hand out on
        #: (one stream for the whole run: ``_host_batches``); None until first iterated.
        self._stream: Generator[Any, None, None] | None = None

    @property
    def lookahead(self) -> int:
        """Steps the sampler has cut beyond the last one handed out (loader prefetch)."""
        return max(self.sampler.global_step - self._consumed[2], 0)

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch - self._consumed[1]

    @property
    def epoch(self) -> int:
        return self._position()[0]

    def _position(self) -> tuple[int, int, int]:
        epoch, step_in_epoch, gstep = self._consumed
        if step_in_epoch >= self.sampler.steps_per_epoch:
            return epoch + 1, 0, gstep
        return epoch, step_in_epoch, gstep

    def _fetch(self, indices: list[int]) -> Any:
        if self.fast:
            return self.dataset.get_batch(indices, self.ctx.device)  # type: ignore[attr-defined]
        return default_collate([self.dataset[i] for i in indices])

    def samples(self, count: int) -> Any:
        """The dataset's first ``count`` samples as one batch on this rank's device, read by
        index: the sampler, its position and its plans are not touched (the memory probe)."""
        available = len(self.dataset)  # type: ignore[arg-type]
        return to_device(self._fetch(list(range(min(count, available)))), self.ctx.device)

    def __iter__(self) -> Iterator[Any]:
        s = self.sampler
        epoch, step_in_epoch, gstep = self._position()
        device = self.ctx.device
        source: Iterator[Any]
        if self.fast:
            s.epoch, s.step_in_epoch, s.global_step = epoch, step_in_epoch, gstep
            source = (to_device(self._fetch(idx), device) for idx in s)
        else:
            if self._stream is None:
                s.epoch, s.step_in_epoch, s.global_step = epoch, step_in_epoch, gstep
                self._stream = device_batches(self._host_batches(), device)
            source = self._stream
        while step_in_epoch < s.steps_per_epoch:
            # Checked before drawing: the stream's next batch belongs to the next epoch.
            batch = next(source, None)
            if batch is None:
                return
            sizes = s.batches_at(step_in_epoch, gstep)
            s.schedule.prune(gstep)
            self.ctx._begin_step(sizes)
            step_in_epoch += 1
            gstep += 1
            self._consumed = (epoch, step_in_epoch, gstep)
            yield batch

    def _host_batches(self) -> Iterator[Any]:
        """Every later batch from one ``DataLoader`` iterator, across epochs, so its
        workers keep loading through an epoch's end instead of starting cold and
        leaving the first steps of each epoch waiting (a user's loop that rebuilds its
        iterator every epoch pays that). The iterator is rebuilt only when the plan of
        the next step to draw asks for another worker count."""
        s = self.sampler
        epoch, step_in_epoch, gstep = s.epoch, s.step_in_epoch, s.global_step
        it: Iterator[Any] | None = None
        while True:
            if step_in_epoch >= s.steps_per_epoch:
                epoch, step_in_epoch = epoch + 1, 0
            want = self._workers_for(gstep, fresh=it is None)
            if it is None or want != self.workers:
                # Dropping the old iterator shuts its workers down; the sampler restarts
                # at the next step to hand out, so their prefetched batches are drawn again.
                it = None
                self._set_workers(gstep, want)
                s.epoch, s.step_in_epoch, s.global_step = epoch, step_in_epoch, gstep
                it = iter(self._dataloader_with(want))
            try:
                batch = next(it)
            except StopIteration:
                return
            step_in_epoch += 1
            gstep += 1
            yield batch

    def _workers_for(self, step: int, fresh: bool) -> int:
        """Workers for drawing ``step``: with a ``share``, the plan's rounded share when
        workers start anyway (``fresh``: an epoch's first iterator), else with hysteresis."""
        if self.share is None:
            return self.workers
        plan = self.sampler.schedule.at(step)
        return self.share.initial(plan) if fresh else self.share.next_count(plan, self.workers)

    def _set_workers(self, step: int, count: int) -> None:
        if count == self.workers:
            return
        self.workers = count
        if self.worker_counts[-1][0] == step:
            self.worker_counts[-1] = (step, count)
        else:
            self.worker_counts.append((step, count))

    def _dataloader_with(self, workers: int) -> DataLoader[Any]:
        return DataLoader(
            self.dataset,
            batch_sampler=_Epochs(self.sampler),
            num_workers=workers,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            pin_memory=self.pin_memory,
        )

    def redraw(self, plan: Sequence[int]) -> Any:
        """This rank's share of the step last yielded, cut again by ``plan``.

        For retrying a step (a rank ran out of memory): the step's global
        samples stay the same and only the cut between ranks moves, so nothing
        is dropped or seen twice. Call it identically on every rank.
        """
        s = self.sampler
        epoch, step_in_epoch, _ = self._consumed
        step_in_epoch -= 1
        sizes = s.cut(tuple(plan), step_in_epoch)
        start = step_in_epoch * s.global_batch + sum(sizes[: self.ctx.rank])
        indices = s._permutation(epoch)[start : start + sizes[self.ctx.rank]]
        self.ctx._begin_step(sizes)
        return to_device(self._fetch(indices), self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        state = self.sampler.state_dict()
        state["epoch"], state["step_in_epoch"], state["global_step"] = self._position()
        return state

    def load_state_dict(self, state: dict[str, Any], plans: bool = True) -> None:
        """Restore the position; ``plans=False`` keeps this run's plans (another world size)."""
        self.close()
        self.sampler.load_state_dict(state, plans=plans)
        self._consumed = (self.sampler.epoch, self.sampler.step_in_epoch, self.sampler.global_step)

    def close(self) -> None:
        """Stop the DataLoader's workers (a later iteration starts them again)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class _Epochs:
    """A batch sampler that goes on into the next epoch where ``sampler`` stops: the
    uneven sampler yields the rest of its epoch, then moves to the next one's start."""

    def __init__(self, sampler: UnevenBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        while self.sampler.steps_per_epoch > 0:
            yield from self.sampler
