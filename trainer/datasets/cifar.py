"""CIFAR-10 / CIFAR-100 from a local directory, read by torchvision's own classes.

``root`` holds ``cifar-10-batches-py/`` or ``cifar-100-python/`` exactly as in
the official python tarballs (pickled batches). Nothing is downloaded: a
missing directory is a one-line error naming the path.

torchvision checks each file against the md5 of the official tarball, which
rejects any re-packed copy (a subset, a mirror's re-pickle, the tiny files the
tests write); the subclasses below check that the files exist and leave the
parsing to torchvision. The decoded images are kept as one ``uint8`` tensor and
normalized on the device in ``get_batch``: no PIL round trip per sample.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hetero.core.errors import ConfigError

#: Per-channel mean and std of the CIFAR-10 training images (0..1 scale).
_MEAN = (0.4914, 0.4822, 0.4465)
_STD = (0.2470, 0.2435, 0.2616)

FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def _existence_checked(cls: Any) -> Any:
    """A torchvision CIFAR class whose files are checked for existence, not md5."""

    class Checked(cls):  # type: ignore[misc]
        train_list = [(name, None) for name, _ in cls.train_list]
        test_list = [(name, None) for name, _ in cls.test_list]
        meta = {**cls.meta, "md5": None}

    Checked.__name__ = f"Local{cls.__name__}"
    return Checked


class CifarTensors(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """CIFAR images as normalized ``(3, 32, 32)`` float tensors with integer labels."""

    def __init__(self, name: str, root: str | Path, *, train: bool = True) -> None:
        from torchvision import datasets

        if name not in FOLDERS:
            raise ConfigError(f"unknown CIFAR variant {name!r} (known: {', '.join(FOLDERS)})")
        folder = Path(root) / FOLDERS[name]
        if not folder.is_dir():
            raise ConfigError(
                f"no {name} data at {str(folder)!r} (unpack the official python version under "
                f"--data-dir; nothing is downloaded)"
            )
        cls = _existence_checked(datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100)
        try:
            ds = cls(str(root), train=train, download=False)
        except (RuntimeError, OSError, pickle.UnpicklingError, KeyError, ValueError) as exc:
            split = "training" if train else "test"
            raise ConfigError(
                f"cannot read {name} {split} data under {str(folder)!r}: {exc}"
            ) from None
        self.name = name
        self.classes: list[str] = list(ds.classes)
        # (N, 32, 32, 3) uint8 -> (N, 3, 32, 32): channels first, as models expect.
        self.images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        self.labels = torch.tensor(ds.targets, dtype=torch.long)
        self._device_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.labels)

    def _normalize(self, images: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(_MEAN, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(_STD, device=images.device).view(1, 3, 1, 1)
        return (images.float() / 255.0 - mean) / std

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._normalize(self.images[index : index + 1])[0], self.labels[index]

    def get_batch(
        self, indices: list[int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._device_cache:
            self._device_cache[key] = (self.images.to(device), self.labels.to(device))
        images, labels = self._device_cache[key]
        idx = torch.tensor(indices, dtype=torch.long)
        if device.type == "cuda":
            idx = idx.pin_memory().to(device, non_blocking=True)
        return self._normalize(images.index_select(0, idx)), labels.index_select(0, idx)


def write_cifar(root: str | Path, name: str, train: int, test: int, *, seed: int = 0) -> Path:
    """Write a small CIFAR directory in the official python format (tests, demos).

    ``train`` and ``test`` images of random pixels with labels ``i mod classes``,
    the training images spread over the five ``data_batch_*`` files for
    CIFAR-10. Returns the folder written.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    folder = Path(root) / FOLDERS[name]
    folder.mkdir(parents=True, exist_ok=True)
    classes = 10 if name == "cifar10" else 100
    key = "labels" if name == "cifar10" else "fine_labels"

    def dump(file: str, n: int, offset: int) -> None:
        data = rng.integers(0, 256, size=(n, 3 * 32 * 32), dtype=np.uint8)
        labels = [(offset + i) % classes for i in range(n)]
        with (folder / file).open("wb") as fh:
            pickle.dump({"data": data, key: labels, "coarse_labels": labels}, fh)

    if name == "cifar10":
        per = [train // 5 + (1 if i < train % 5 else 0) for i in range(5)]
        offset = 0
        for i, n in enumerate(per, start=1):
            dump(f"data_batch_{i}", n, offset)
            offset += n
        dump("test_batch", test, 0)
        meta = {"label_names": [f"class{i}" for i in range(classes)]}
        meta_file = "batches.meta"
    else:
        dump("train", train, 0)
        dump("test", test, 0)
        meta = {"fine_label_names": [f"class{i}" for i in range(classes)]}
        meta_file = "meta"
    with (folder / meta_file).open("wb") as fh:
        pickle.dump(meta, fh)
    return folder
