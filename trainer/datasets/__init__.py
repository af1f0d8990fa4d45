"""Built-in datasets, by name: the implementations of the catalogue's datasets.

``hetero.core.catalogue`` describes each dataset (kind, whether it reads
``data_dir``, its size); ``build_dataset`` builds it, and ``BUILT`` must name
exactly the catalogue's datasets, which a test checks. Image datasets yield
``(image, label)``; the text datasets (``TEXT_DATASETS``) yield windows of
token ids that a language-model task turns into ``(input, target)`` pairs
(``hetero.trainer.tasks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from hetero.core import catalogue
from hetero.core.errors import ConfigError
from hetero.trainer.datasets.cifar import CifarTensors
from hetero.trainer.datasets.folder import image_folder
from hetero.trainer.datasets.synthetic import SyntheticImages
from hetero.trainer.datasets.text import ByteText, SyntheticText

DATASETS = tuple(d.name for d in catalogue.DATASETS)
TEXT_DATASETS = tuple(d.name for d in catalogue.DATASETS if d.kind == "text")
#: The datasets ``build_dataset`` implements.
BUILT = ("synthetic", "synthetic-text", "imagefolder", "text", "cifar10", "cifar100")


def build_dataset(
    name: str,
    *,
    image_size: int,
    num_classes: int,
    num_samples: int = 4096,
    data_dir: str | Path | None = None,
    seed: int = 0,
    seq_len: int = 64,
    vocab_size: int = 256,
    train: bool = True,
) -> Dataset[Any]:
    """``seq_len`` and ``vocab_size`` concern the text datasets; ``train`` picks CIFAR's split."""
    name = catalogue.dataset(name).name  # an alias as its dataset; unknown: a hint
    if name == "synthetic":
        return SyntheticImages(num_samples, image_size, num_classes, seed=seed)
    if name == "synthetic-text":
        return SyntheticText(num_samples, seq_len, vocab_size, seed=seed)
    if data_dir is None:
        raise ConfigError(f"dataset {name!r} needs --data-dir")
    if name == "imagefolder":
        return image_folder(data_dir, image_size)
    if name == "text":
        return ByteText(data_dir, seq_len)
    return CifarTensors(name, data_dir, train=train)


__all__ = [
    "BUILT",
    "DATASETS",
    "TEXT_DATASETS",
    "ByteText",
    "CifarTensors",
    "SyntheticImages",
    "SyntheticText",
    "build_dataset",
    "image_folder",
]
