"""An ImageFolder-style directory: ``root/<class>/<image>``, via torchvision."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from hetero.core.errors import ConfigError


def image_folder(root: str | Path, image_size: int) -> Dataset[tuple[torch.Tensor, int]]:
    """Images resized and center-cropped to ``image_size``, normalized to ImageNet stats."""
    from torchvision import datasets, transforms

    path = Path(root)
    if not path.is_dir():
        raise ConfigError(f"data_dir {str(path)!r} is not a directory")
    tf = transforms.Compose(
        [
            transforms.Resize(image_size),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    try:
        ds: Dataset[tuple[torch.Tensor, int]] = datasets.ImageFolder(str(path), transform=tf)
    except (FileNotFoundError, RuntimeError) as exc:
        raise ConfigError(f"data_dir {str(path)!r}: {exc}") from None
    return ds
