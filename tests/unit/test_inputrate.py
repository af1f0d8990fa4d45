"""The input pipeline's timing wrappers and the rate they give (trainer.inputrate)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from hetero.trainer.inputrate import InputTimes, TimedCollate, TimedDataset


class Batched(Dataset[int]):
    """A dataset with its own batched fetch, returning a mapping (not a list of samples)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        raise AssertionError("the batched fetch must be used")

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        return {"x": torch.tensor(indices), "n": len(indices)}


def test_a_datasets_own_batched_fetch_is_used_and_collated_as_the_dataloader_would():
    fetched = TimedDataset(Batched()).__getitems__([3, 1, 4])
    batch, samples, seconds = TimedCollate(lambda data: data)(fetched)
    assert torch.equal(batch["x"], torch.tensor([3, 1, 4])) and batch["n"] == 3
    assert samples == 3 and 0.0 <= seconds < 1.0


def test_without_a_batched_fetch_the_samples_are_read_one_by_one_and_collated():
    class Items(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.tensor([i, i])

    batch, samples, _ = TimedCollate()(TimedDataset(Items()).__getitems__([2, 5]))
    assert torch.equal(batch, torch.tensor([[2, 2], [5, 5]])) and samples == 2


def test_input_s_is_the_median_seconds_per_sample_times_the_batch_over_the_workers():
    times = InputTimes(workers=4)
    for step, (samples, seconds) in enumerate([(10, 0.1), (20, 0.2), (10, 5.0), (5, 0.05)]):
        times.add(step, samples, seconds)
    # Per sample 0.01, 0.01, 0.5 (a stalled batch), 0.01: the median is 0.01 s, and
    # the stall does not move the robust spread off 0.
    assert times.input_rate(range(4), 40) == (pytest.approx(40 * 0.01 / 4), 0.0)
    assert times.input_rate([7, 8], 40) == (None, None)  # no batch of those steps was timed
    times.forget_before(3)
    # One batch: a rate, but no spread (it takes three).
    assert times.input_rate([2, 3], 5) == (pytest.approx(5 * 0.01 / 4), None)


def test_input_cv_is_the_robust_relative_spread_of_the_batches_seconds_per_sample():
    times = InputTimes(workers=1)
    for step, per_sample in enumerate([0.008, 0.010, 0.012, 0.010, 0.050]):
        times.add(step, 10, 10 * per_sample)
    _, cv = times.input_rate(range(5), 10)
    # Median 0.010; deviations 0.2, 0, 0.2, 0, 4.0: MAD 0.2, times 1.4826.
    assert cv == pytest.approx(1.4826 * 0.2)
