"""Built-in datasets, by name."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from hetero.errors import ConfigError
from hetero.trainer.datasets.folder import image_folder
from hetero.trainer.datasets.synthetic import SyntheticImages

DATASETS = ("synthetic", "imagefolder")


def build_dataset(
    name: str,
    *,
    image_size: int,
    num_classes: int,
    num_samples: int = 4096,
    data_dir: str | Path | None = None,
    seed: int = 0,
) -> Dataset[tuple[torch.Tensor, torch.Tensor]] | Dataset[tuple[torch.Tensor, int]]:
    if name == "synthetic":
        return SyntheticImages(num_samples, image_size, num_classes, seed=seed)
    if name == "imagefolder":
        if data_dir is None:
            raise ConfigError("dataset 'imagefolder' needs --data-dir")
        return image_folder(data_dir, image_size)
    raise ConfigError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")


__all__ = ["DATASETS", "SyntheticImages", "build_dataset", "image_folder"]
