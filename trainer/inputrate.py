"""The input pipeline's rate: the worker seconds one sample costs, measured in the workers.

A rank whose batches come from ``w`` DataLoader workers, each spending ``c``
seconds per sample (fetching it, the dataset's own transforms, collating), gets
at most one batch of ``b`` samples every ``b·c/w`` seconds, whatever its device
does: that is ``input_s``, seconds per step. The wait the training thread sees
(``data_s``) shows the limit only once it binds; ``input_s`` shows it before,
at any batch size, so a plan can keep each rank's batch within what its input
pipeline makes.

It is measured without changing the user's data. The DataLoader is given
``TimedDataset(dataset)``, whose ``__getitems__`` reads the clock once in the
worker and fetches the samples as the DataLoader itself would (the dataset's
``__getitems__`` if it has one, else ``dataset[i]`` per index), and
``TimedCollate(collate)``, which collates them and returns ``(batch, samples,
seconds)``; the loader takes the batch back out in the main process, so
``pin_memory`` and the copy to the device see the user's batch. That is two
clock reads per batch, in the worker.

The seconds are wall time in the worker: a worker that waits for a disk, or for
a core that the workers of the host's other ranks are using, makes batches more
slowly for it, and so does the pipeline. ``input_s`` is the median per sample
over the steps asked for (robust to a batch that met a page fault or a
collector pause), times the batch, over the workers; ``input_cv`` is the robust
relative spread of those per-sample seconds, which says how well one interval's
median is known (``core.balancer.pipeline``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from torch.utils.data import Dataset, default_collate

from hetero.core.balancer.robust_fit import robust_scale


class TimedDataset(Dataset[Any]):
    """``dataset`` whose batched fetch also returns when it started (``perf_counter``
    seconds, in the worker that fetched); single items are passed through."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> tuple[float, int, Any]:
        """``(start, samples, what the dataset fetched)``: the count is the indices',
        whatever a dataset's own ``__getitems__`` returns."""
        started = time.perf_counter()
        many = getattr(self.dataset, "__getitems__", None)
        fetched = many(indices) if many else [self.dataset[i] for i in indices]
        return started, len(indices), fetched


class TimedCollate:
    """``collate`` over a :class:`TimedDataset`'s fetch: ``(batch, samples, seconds)``,
    ``seconds`` from the fetch's start to the end of collating."""

    def __init__(self, collate: Callable[[Any], Any] = default_collate) -> None:
        self.collate = collate

    def __call__(self, fetched: Any) -> tuple[Any, int, float]:
        started, samples, data = fetched  # TimedDataset.__getitems__'s
        batch = self.collate(data)
        return batch, samples, time.perf_counter() - started


class InputTimes:
    """Worker seconds of each batch the loader drew, by the global step it is for."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"input times need DataLoader workers, got {workers}")
        self.workers = workers
        self._by_step: dict[int, tuple[int, float]] = {}

    def add(self, step: int, samples: int, seconds: float) -> None:
        self._by_step[step] = (samples, seconds)

    def input_rate(self, steps: Iterable[int], batch: int) -> tuple[float | None, float | None]:
        """``(input_s, input_cv)``: seconds per step the workers need for batches of
        ``batch`` samples, from the median worker seconds per sample of ``steps``'
        batches, and the robust relative spread of those seconds per sample; None if no
        batch was timed (the spread: fewer than 3)."""
        per_sample = [
            seconds / samples
            for samples, seconds in (self._by_step.get(s, (0, 0.0)) for s in steps)
            if samples > 0
        ]
        if not per_sample:
            return None, None
        mid = statistics.median(per_sample)
        spread = None
        if len(per_sample) >= 3 and mid > 0:
            spread = robust_scale([v / mid - 1.0 for v in per_sample])
        return batch * mid / self.workers, spread

    def forget_before(self, step: int) -> None:
        """Drop the batches of steps before ``step`` (summarized already)."""
        for s in [s for s in self._by_step if s < step]:
            del self._by_step[s]

    def clear(self) -> None:
        self._by_step.clear()
