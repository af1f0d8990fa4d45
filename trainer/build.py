"""What a built-in job trains: its task, model, dataset and optimizer, from its options.

Everything here is the same on every rank and touches no process group:
``build`` makes the task, a model (on no device yet), the training dataset
prepared for the task and a factory of fresh models (the standalone
measurement trains copies); ``make_optimizer`` the optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hetero.trainer.datasets import build_dataset
from hetero.trainer.jobconfig import JobConfig
from hetero.trainer.models import model_info
from hetero.trainer.tasks import Task, make_task


@dataclass
class Built:
    """A job's parts. ``size`` is pixels per side, or tokens per sample for a language model."""

    task: Task
    model: nn.Module
    dataset: Any
    fresh: Callable[[], nn.Module]
    size: int


def build(cfg: JobConfig) -> Built:
    """The task, the model, the training dataset and a factory of fresh models."""
    info = model_info(cfg.model)
    task = make_task(info.task)
    assert cfg.dataset is not None  # the catalogue fills in the model's default
    if task.text:
        size = cfg.seq_len or info.default_image_size

        def fresh() -> nn.Module:
            return info.build(0, size)

        raw = fresh()
        data = build_dataset(
            cfg.dataset,
            image_size=0,
            num_classes=0,
            num_samples=cfg.num_samples,
            data_dir=cfg.data_dir,
            seed=cfg.seed,
            seq_len=size,
            vocab_size=task.data_vocab(raw),
        )
    else:
        size = cfg.image_size or info.default_image_size
        data = build_dataset(
            cfg.dataset,
            image_size=size,
            num_classes=cfg.num_classes,
            num_samples=cfg.num_samples,
            data_dir=cfg.data_dir,
            seed=cfg.seed,
        )
        num_classes = getattr(data, "num_classes", cfg.num_classes)

        def fresh() -> nn.Module:
            return info.build(num_classes, size)

        raw = fresh()

    return Built(task, raw, task.prepare(data, raw, seed=cfg.seed), fresh, size)


def make_optimizer(cfg: JobConfig, model: nn.Module, world_size: int) -> torch.optim.Optimizer:
    """SGD with momentum for image models, AdamW for language models (``auto``); ZeRO on request.

    ``zero`` shards the optimizer state over the ranks (``ZeroRedundancyOptimizer``);
    alone, a rank keeps the plain optimizer.
    """
    kind = cfg.optimizer_kind
    lr = cfg.learning_rate(kind)
    cls: type[torch.optim.Optimizer]
    kwargs: dict[str, Any]
    if kind == "sgd":
        cls, kwargs = torch.optim.SGD, {"lr": lr, "momentum": 0.9}
    else:
        cls = torch.optim.AdamW
        kwargs = {"lr": lr, "betas": (0.9, 0.95), "weight_decay": 0.01}
    if cfg.zero and world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kwargs)
    return cls(model.parameters(), **kwargs)


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer a single process would use (ZeRO's local one), for the ideal."""
    return getattr(optimizer, "optim", optimizer)
