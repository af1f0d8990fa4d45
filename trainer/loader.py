"""``HeteroLoader``: one epoch of this rank's share of each global batch, on its device.

The uneven sampler (``trainer.sampler``) cuts each global batch by the plan in
force at that step; the loader tells the context each step's sizes (the
gradient weighting) and keeps its position for checkpoints.

Through a ``DataLoader`` it copies the next batch to a CUDA device while this one
computes (``trainer.prefetch``) and times its workers (``trainer.inputrate``). A
rank runs the ``num_workers`` its user asked for, as plain DDP does, from one
``DataLoader`` iterator for the whole run: a new plan changes only what the batch
sampler cuts from the step it applies at, and the workers, already loading ahead,
make the new plan's batches before that step, so a plan change restarts, drains
and refills nothing. The count stays fixed because a stock ``DataLoader`` can only
change it with new worker processes (their start and first batches cost seconds
per change on input-bound GPU ranks), because moving workers between a host's
ranks helps only where the host has idle cores, where raising ``num_workers``
helps every rank more, and because a fixed layout keeps the processes and memory
exactly plain DDP's.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset, default_collate

from hetero.core.errors import CheckpointError
from hetero.trainer.inputrate import InputTimes, TimedCollate, TimedDataset
from hetero.trainer.prefetch import device_batches, to_device
from hetero.trainer.sampler import UnevenBatchSampler

if TYPE_CHECKING:
    from hetero.trainer.context import Context


class HeteroLoader:
    """Iterates one epoch of this rank's batches, already on the rank's device; the
    next iteration continues where the last one stopped (a loop that breaks early
    loses no batch).

    Datasets with a ``get_batch(indices, device)`` method are gathered directly
    (fast, no worker processes) unless a ``collate_fn`` is given; others go through a
    ``DataLoader`` whose ``batch_sampler`` is the uneven sampler and whose batches
    ``collate_fn`` makes (``default_collate`` if None), in the workers or, without,
    on the training thread. Plan changes are scheduled after the steps the loaders
    have already drawn (``lookahead``, gathered from every rank at each boundary).

    With ``num_workers`` > 0 the workers' seconds per batch are kept by step
    (``input_s``).
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
        collate_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        self.ctx = ctx
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.fast = hasattr(dataset, "get_batch") and num_workers == 0 and collate_fn is None
        self.collate_fn: Callable[[Any], Any] = collate_fn or default_collate
        #: The workers' seconds per batch drawn; None without workers (batches are made
        #: on the training thread, their time is in ``data_s``).
        self.input_times = InputTimes(num_workers) if num_workers > 0 else None
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
        return self.collate_fn([self.dataset[i] for i in indices])

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
        """Every later batch from one ``DataLoader`` iterator, across epochs and plan
        changes, so its workers keep loading through both instead of starting cold and
        leaving the next steps waiting (a user's loop that rebuilds its iterator every
        epoch pays that). With workers, each batch's worker seconds are kept by step."""
        step = self.sampler.global_step
        timed = self.input_times
        loader = DataLoader(
            TimedDataset(self.dataset) if timed is not None else self.dataset,
            batch_sampler=_Epochs(self.sampler),
            num_workers=self.num_workers,
            collate_fn=TimedCollate(self.collate_fn) if timed is not None else self.collate_fn,
            prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
            pin_memory=self.pin_memory,
        )
        for item in loader:
            if timed is not None:
                item, samples, seconds = item
                timed.add(step, samples, seconds)
            step += 1
            yield item

    def input_rate(self, steps: Iterable[int], batch: int) -> tuple[float | None, float | None]:
        """``(input_s, input_cv)``: seconds per step this rank's workers need to make a
        batch of ``batch`` samples, from the batches of global steps ``steps``, and
        their spread (``trainer.inputrate``); None without workers or timed batches."""
        if self.input_times is None:
            return None, None
        return self.input_times.input_rate(steps, batch)

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
        mine = self.ctx.dp_rank
        start = step_in_epoch * s.global_batch + sum(sizes[:mine])
        indices = s._permutation(epoch)[start : start + sizes[mine]]
        self.ctx._begin_step(sizes)
        return to_device(self._fetch(indices), self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        state = self.sampler.state_dict()
        state["epoch"], state["step_in_epoch"], state["global_step"] = self._position()
        return state

    def load_state_dict(self, state: dict[str, Any], plans: bool = True) -> None:
        """Restore the position; ``plans=False`` keeps this run's plans (another world size)."""
        if state.get("kind") == "stream":
            raise CheckpointError(
                "the checkpoint's loader read a stream, this run's reads a map-style dataset"
            )
        self.close()
        self.sampler.load_state_dict(state, plans=plans)
        self._consumed = (self.sampler.epoch, self.sampler.step_in_epoch, self.sampler.global_step)

    def close(self) -> None:
        """Stop the DataLoader's workers (a later iteration starts them again)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self.input_times is not None:
            self.input_times.clear()


class _Epochs:
    """A batch sampler that goes on into the next epoch where ``sampler`` stops: the
    uneven sampler yields the rest of its epoch, then moves to the next one's start."""

    def __init__(self, sampler: UnevenBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        while self.sampler.steps_per_epoch > 0:
            yield from self.sampler
