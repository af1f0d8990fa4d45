"""``HeteroLoader``: one epoch of this rank's share of each global batch, on its device.

The uneven sampler (``trainer.sampler``) cuts each global batch by the plan in
force at that step; the loader tells the context each step's sizes (the
gradient weighting) and keeps its position for checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from hetero.trainer.sampler import UnevenBatchSampler

if TYPE_CHECKING:
    from hetero.trainer.context import Context


class HeteroLoader:
    """Iterates one epoch of this rank's batches, already on the rank's device.

    Datasets with a ``get_batch(indices, device)`` method are gathered directly
    (fast, no worker processes); others go through a ``DataLoader`` whose
    ``batch_sampler`` is the uneven sampler. A loader that prefetches ``depth``
    batches gets plan changes scheduled ``depth`` steps ahead.
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
    ) -> None:
        self.ctx = ctx
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = num_workers
        self.fast = hasattr(dataset, "get_batch") and num_workers == 0
        self.prefetch_depth = num_workers * prefetch_factor if num_workers > 0 else 0
        self._dataloader: DataLoader[Any] | None = None
        if not self.fast:
            self._dataloader = DataLoader(
                dataset,
                batch_sampler=sampler,
                num_workers=num_workers,
                prefetch_factor=prefetch_factor if num_workers > 0 else None,
                pin_memory=pin_memory,
            )
        self._consumed = (sampler.epoch, sampler.step_in_epoch, sampler.global_step)

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

    def __iter__(self) -> Iterator[Any]:
        s = self.sampler
        s.epoch, s.step_in_epoch, s.global_step = self._position()
        epoch, step_in_epoch, gstep = s.epoch, s.step_in_epoch, s.global_step
        source: Iterator[Any]
        if self._dataloader is not None:
            source = iter(self._dataloader)
        else:
            source = (self._fetch(idx) for idx in s)
        for batch in source:
            sizes = s.batches_at(step_in_epoch, gstep)
            s.schedule.prune(gstep)
            self.ctx._begin_step(sizes)
            step_in_epoch += 1
            gstep += 1
            self._consumed = (epoch, step_in_epoch, gstep)
            yield _to_device(batch, self.ctx.device)

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
        return _to_device(self._fetch(indices), self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        state = self.sampler.state_dict()
        state["epoch"], state["step_in_epoch"], state["global_step"] = self._position()
        return state

    def load_state_dict(self, state: dict[str, Any], plans: bool = True) -> None:
        """Restore the position; ``plans=False`` keeps this run's plans (another world size)."""
        self.sampler.load_state_dict(state, plans=plans)
        self._consumed = (self.sampler.epoch, self.sampler.step_in_epoch, self.sampler.global_step)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
