"""The DataLoader path keeps one iterator for the run: workers load through epoch ends.

A user's loop iterates the loader once per epoch, and may break out mid-epoch and
come back. Both must lose no batch, and the DataLoader's workers must not be
restarted at each epoch (a cold start there left the first steps of every epoch
waiting for data on GPUs). One process, real DataLoader workers.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import Dataset, get_worker_info

from hetero import trainer as ht

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
