"""``StreamLoader``: one pass of this rank's share of each global batch from a stream.

The stream's cut (``trainer.stream``) and the pass's end (``trainer.passend``) come
together here, the stream's counterpart of ``HeteroLoader``: iterating it yields this
rank's batches on its device until the pass ends on every rank; the next iteration
goes on with the next pass. As on the map-style path one ``DataLoader`` iterator
serves the whole run (``trainer.loader``): its workers keep their iterators across
plan changes and start each pass's from where they are, and its batch sampler is the
``StreamSampler``, whose requests tell each worker the size of the batch it makes.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from torch.utils.data import DataLoader

from hetero.core.errors import ConfigError
from hetero.trainer.inputrate import InputTimes
from hetero.trainer.passend import PassEnds
from hetero.trainer.prefetch import device_batches, to_device
from hetero.trainer.stream import StreamCollate, StreamReader, StreamSampler

if TYPE_CHECKING:
    from hetero.trainer.context import Context

log = logging.getLogger("hetero.trainer")

#: What the run's batch stream yields where a pass ends (``to_device`` passes it as is).
PASS_END = object()


class StreamLoader:
    """Iterates one pass of this rank's batches from a stream, already on the rank's
    device; the next iteration continues where the last one stopped (a loop that breaks
    early loses no batch), and a pass's end starts the next pass.

    ``passes`` records each pass that ended: ``(pass, first step, end step, rank)``, the
    rank the lowest among those whose part ran out at the end step. With ``num_workers``
    > 0 the workers' seconds per batch are kept by step (``input_s``)."""

    def __init__(
        self,
        ctx: Context,
        dataset: Iterable[Any],
        sampler: StreamSampler,
        *,
        num_workers: int,
        prefetch_factor: int,
        pin_memory: bool,
        collate_fn: Callable[[Any], Any],
        split: str,
    ) -> None:
        self.ctx = ctx
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.collate_fn = collate_fn
        self.split = split
        self.reader = StreamReader(dataset, ctx.rank, ctx.world_size, sampler.readers, split)
        self.input_times = InputTimes(num_workers) if num_workers > 0 else None
        self.ends = PassEnds(ctx.rank, ctx.world_size)
        self.passes: list[tuple[int, int, int, int]] = []
        self._consumed = sampler.global_step  # the next step to hand out
        self._stream: Generator[Any, None, None] | None = None

    @property
    def lookahead(self) -> int:
        """Steps requested beyond the last one handed out (read-ahead and prefetch)."""
        return max(self.sampler.global_step - self._consumed, 0)

    @property
    def epoch(self) -> int:
        """The pass the next batch comes from."""
        return self.sampler.epoch

    def __iter__(self) -> Iterator[Any]:
        if self._stream is None:
            self.sampler.rewind(self._consumed)
            self._stream = device_batches(self._agreed(), self.ctx.device)
        for item in self._stream:
            if item is PASS_END:
                return
            step, batch = item
            self.sampler.schedule.prune(self.sampler.pass_start)
            self.ctx._begin_step(self.sampler.schedule.at(step))
            self._consumed = step + 1
            yield batch

    def _agreed(self) -> Iterator[Any]:
        """The run's ``(step, batch)`` on the host, every pass's followed by ``PASS_END``."""
        results = self._host_results()
        while True:
            yield from self._pass(results)
            yield PASS_END

    def _pass(self, results: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        """The current pass from the step to hand out next: each step once every rank has
        read it (``trainer.passend``), up to the first step one could not fill."""
        s, ends = self.sampler, self.ends
        # The sampler's next request, not ``_consumed``: on CUDA the loop may not have
        # taken the last step of the pass before yet (``device_batches`` reads one ahead).
        step = s.global_step
        ends.start(step)
        ahead: deque[tuple[int, Any]] = deque()
        short: int | None = None
        while True:
            ends.pace(step, self.ctx.summaries)
            want = step + ends.read_ahead()
            while short is None and (ahead[-1][0] if ahead else step - 1) < want:
                at, batch = next(results)
                if batch is None:
                    short = at
                else:
                    ahead.append((at, batch))
            if not ends.agree(step, ahead[-1][0] if ahead else step - 1, short):
                break
            at, batch = ahead.popleft()
            assert at == step, (at, step)
            yield at, batch
            step += 1
        self.passes.append((s.epoch, s.pass_start, step, ends.short_rank))
        if step == s.pass_start:
            raise ConfigError(
                f"the stream ran out before the first step of pass {s.epoch} on rank "
                f"{ends.short_rank}: it yields fewer items than a batch to a reader, or "
                "cannot be iterated again (a generator object: give an IterableDataset)"
            )
        log.info(
            "stream pass %d ended at step %d after %d steps: rank %d's part ran out",
            s.epoch,
            step,
            step - s.pass_start,
            ends.short_rank,
        )
        s.end_pass(step)

    def _host_results(self) -> Iterator[tuple[int, Any]]:
        """``(step, batch or None)`` of the current pass's requests, in step order, from the
        run's one ``DataLoader`` iterator; results of a pass that ended, and pads, are
        dropped as they arrive. With workers, each batch's worker seconds are kept."""
        loader = DataLoader(
            self.reader,
            batch_sampler=cast(Iterable[list[int]], self.sampler),
            num_workers=self.num_workers,
            collate_fn=StreamCollate(self.collate_fn),  # type: ignore[arg-type]
            prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
            pin_memory=self.pin_memory,
        )
        timed = self.input_times
        for take, batch, samples, seconds in loader:
            if take.size == 0 or take.pass_ != self.sampler.epoch:
                continue
            if timed is not None and batch is not None:
                timed.add(take.step, samples, seconds)
            yield take.step, batch

    def input_rate(self, steps: Iterable[int], batch: int) -> tuple[float | None, float | None]:
        """``(input_s, input_cv)``: seconds per step this rank's workers need to make a
        batch of ``batch`` samples, from the batches of global steps ``steps``, and
        their spread (``trainer.inputrate``); None without workers or timed batches."""
        if self.input_times is None:
            return None, None
        return self.input_times.input_rate(steps, batch)

    def samples(self, count: int) -> Any:
        """The stream's first ``count`` items as one batch on this rank's device, from an
        iterator of its own: the passes and readers are not touched (the memory probe)."""
        items = list(islice(iter(self.dataset), count))
        return to_device(self.collate_fn(items), self.ctx.device)

    def redraw(self, plan: Sequence[int]) -> Any:
        raise ConfigError(
            "retrying a step with another cut needs a map-style dataset: a stream's step "
            "cannot move samples between ranks' parts"
        )

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict(self._consumed) | {"split": self.split}

    def load_state_dict(self, state: dict[str, Any], plans: bool = True) -> None:
        """Restore the position: the same pass where the ranks and workers are the same,
        else a new pass from the saved step (``StreamSampler.load_state_dict``)."""
        self.close()
        same = state.get("split", self.split) == self.split
        if not self.sampler.load_state_dict(state, plans=plans and same):
            log.warning(
                "the stream resumes with another number of ranks, workers or split: pass %d "
                "starts at step %d (the rest of pass %d is not read)",
                self.sampler.epoch,
                self.sampler.global_step,
                self.sampler.epoch - 1,
            )
        self._consumed = self.sampler.global_step

    def close(self) -> None:
        """Stop the DataLoader's workers (a later iteration starts them again)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self.input_times is not None:
            self.input_times.clear()
