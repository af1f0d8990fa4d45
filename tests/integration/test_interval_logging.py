"""The interval's figures for the user's loggers, in one process: ``ctx.on_interval`` and
``ht.init(tensorboard=...)``; the figures on two ranks: ``test_stream_distributed.py``.

The docs' ``flat`` (what their W&B and MLflow examples log) runs as written, through a
callback into a plain ``logging`` logger; into W&B and MLflow themselves:
``test_ecosystem_loggers.py`` (``make test-ecosystem``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from docscode import docs_flat
from torch.utils.data import TensorDataset

from hetero import trainer as ht
from hetero.core.errors import ConfigError


def test_callbacks_get_every_boundarys_figures_and_one_that_raises_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    flat = docs_flat()
    logger = logging.getLogger("my-run")
    ctx = ht.init("equal", device="cpu", rebalance_interval=3, tensorboard=str(tmp_path / "tb"))
    try:
        model = ctx.wrap(torch.nn.Linear(2, 1))
        data = TensorDataset(torch.randn(64, 2), torch.randn(64, 1))
        loader = ctx.loader(data, 8)
        ctx.on_interval(lambda f: logger.info("%s", flat(f)))
        ctx.on_interval(lambda f: 1 / 0)
        with caplog.at_level(logging.INFO):
            while ctx.global_step < 12:
                for x, y in loader:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    ctx.backward(loss)
                    ctx.step(loss)
                    if ctx.global_step == 12:
                        break
    finally:
        ctx.close()
    logged: list[Any] = [r.args for r in caplog.records if r.name == "my-run"]
    assert len(logged) == 4  # boundaries at steps 3, 6, 9, 12
    assert all(d["hetero/rank0/batch"] == 8 and d["hetero/samples_per_s"] > 0 for d in logged)
    assert "hetero/gap/imbalance_ms" in logged[-1]
    failed = [r for r in caplog.records if "on_interval callback" in r.getMessage()]
    assert len(failed) == 1 and "ZeroDivisionError" in (failed[0].exc_text or "")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(tmp_path / "tb" / "job"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("throughput/samples_per_s")] == [3, 6, 9, 12]


def test_a_stream_keeps_its_workers_across_passes_and_a_generator_object_is_one_pass(
    tmp_path: Path,
) -> None:
    class Pids(torch.utils.data.IterableDataset[tuple[int, int]]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            import os

            return ((i, os.getpid()) for i in range(40))

    ctx = ht.init("equal", device="cpu")
    try:
        loader = ctx.loader(Pids(), 4, num_workers=2)
        pids, passes = set(), 0
        while passes < 3:
            for _, pid in loader:
                pids |= set(pid.tolist())
            passes += 1
        assert len(pids) == 2 and len(loader.passes) == 3  # type: ignore[union-attr]
    finally:
        ctx.close()
    ctx = ht.init("equal", device="cpu")
    try:
        with pytest.raises(ConfigError, match="split='dataset' is for streams"):
            ctx.loader(TensorDataset(torch.zeros(8)), 4, split="dataset")
        once = ctx.loader((torch.zeros(1) for _ in range(8)), 4)  # a generator object
        assert len(list(once)) == 2
        with pytest.raises(ConfigError, match="cannot be iterated again"):
            list(once)
    finally:
        ctx.close()
