"""The DataLoader path keeps one iterator for the run, and times its workers.

A user's loop iterates the loader once per epoch, and may break out mid-epoch and
come back. Both must lose no batch, and the DataLoader's workers must not be
restarted at each epoch (a cold start there left the first steps of every epoch
waiting for data on GPUs). The workers' seconds per batch give ``input_s``; without
workers there is none. One process, real DataLoader workers (two ranks across plan
changes: ``test_trainer_distributed.py``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from hetero import trainer as ht
from hetero.trainer.datasets import SyntheticImages

SAMPLES = 48
GLOBAL_BATCH = 8  # 6 steps per epoch


class Pids(Dataset[tuple[int, int]]):
    """Sample ``i``: ``i`` and the pid of the worker process that loaded it."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, int]:
        assert get_worker_info() is not None, "loaded in the main process"
        return i, os.getpid()


def test_workers_outlive_epochs_and_a_broken_loop_loses_no_batch(tmp_path: Path) -> None:
    ctx = ht.init("equal", device="cpu", output_dir=str(tmp_path), warmup_steps=0)
    try:
        model = ctx.wrap(torch.nn.Linear(1, 1))
        loader = ctx.loader(Pids(), GLOBAL_BATCH, seed=3, num_workers=2)

        def step(idx: torch.Tensor) -> None:
            loss = model(idx.float().unsqueeze(1)).sum()
            ctx.backward(loss)
            ctx.step(loss)

        per_epoch: list[list[int]] = []
        pids: set[int] = set()
        for epoch in range(3):
            seen: list[int] = []
            for k, (idx, pid) in enumerate(loader):
                seen += idx.tolist()
                pids |= set(pid.tolist())
                step(idx)
                if epoch == 1 and k == 2:
                    break  # leave mid-epoch, then come back to the same epoch
            if epoch == 1:
                for idx, pid in loader:
                    seen += idx.tolist()
                    pids |= set(pid.tolist())
                    step(idx)
            per_epoch.append(seen)
        assert [sorted(s) for s in per_epoch] == [list(range(SAMPLES))] * 3
        assert per_epoch[0] != per_epoch[1]  # each epoch its own order
        assert ctx.global_step == 3 * SAMPLES // GLOBAL_BATCH
        assert len(pids) == 2, f"workers restarted: {len(pids)} pids over 3 epochs"
    finally:
        ctx.close()


class Costly(Dataset[torch.Tensor]):
    """Samples that each take ``cost_s`` seconds to load (a sleep: the workers' wall time,
    what they take on a busy host as on an idle one)."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s

    def __len__(self) -> int:
        return SAMPLES * 4

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.cost_s)
        return torch.full((1,), float(i))


def _last_summary(
    tmp_path: Path, dataset: Dataset[torch.Tensor], batch: int, workers: int
) -> tuple[float | None, dict[str, object]]:
    """One process, 12 steps (two intervals of 6) at ``batch``: the last interval's
    ``input_s`` and metrics record."""
    out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    ctx = ht.init("equal", device="cpu", output_dir=str(out), rebalance_interval=6)
    try:
        model = ctx.wrap(torch.nn.Linear(1, 1))
        loader = ctx.loader(dataset, batch, num_workers=workers)
        for x in loader:
            x = x[0] if isinstance(x, (list, tuple)) else x
            loss = model(x.float().reshape(len(x), -1)[:, :1]).sum()
            ctx.backward(loss)
            ctx.step(loss)
            if ctx.global_step == 12:
                break
        input_s = ctx.summaries[-1][0].input_s
    finally:
        ctx.close()
    records = (out / "metrics" / "rank0.jsonl").read_text().splitlines()
    return input_s, json.loads(records[-1])


@pytest.mark.timeout(120)
def test_input_s_is_the_workers_seconds_per_batch_over_their_number(tmp_path: Path) -> None:
    """Batches of ``b`` samples of ``c`` seconds each from 2 workers: one every
    ``b·c/2`` seconds; it grows with the batch and with the cost per sample."""
    measured = {}
    for batch, cost_s in ((8, 0.012), (24, 0.012), (8, 0.036)):
        input_s, record = _last_summary(tmp_path, Costly(cost_s), batch, workers=2)
        assert input_s is not None and record["input_s"] == input_s
        expected = batch * cost_s / 2
        # A sleep never ends early; a loaded host wakes a worker late, by a few ms at most
        # in the median batch: below the 0.8 x 12 ms a sample this allows (at 4 ms a
        # sample it allowed 3.2 ms, which a busy two-core host can come near).
        assert 0.7 * expected < input_s < 1.8 * expected, (batch, cost_s, input_s)
        measured[batch, cost_s] = input_s
    assert 2.0 < measured[24, 0.012] / measured[8, 0.012] < 4.5, measured
    assert 2.0 < measured[8, 0.036] / measured[8, 0.012] < 4.5, measured


def test_without_workers_there_is_no_input_rate_and_the_wait_stays_data_time(
    tmp_path: Path,
) -> None:
    # A dataset gathered on the device (get_batch)...
    input_s, record = _last_summary(tmp_path, SyntheticImages(SAMPLES * 4, 4, 10), 8, workers=0)
    assert input_s is None and record["input_s"] is None
    # ...and one loaded on the training thread: its 8 x 4 ms per step are input wait.
    input_s, record = _last_summary(tmp_path, Costly(0.004), 8, workers=0)
    assert input_s is None and record["input_s"] is None
    assert record["phases_s"]["data"] > 0.7 * 8 * 0.004, record  # type: ignore[index]
