"""Deterministic synthetic images: the same index gives the same sample on every rank.

A bank of ``bank_size`` random images is drawn once from ``seed``; sample ``i``
is image ``i mod bank_size`` with label ``labels[i]`` (also seeded). The labels
are a fixed function of the image, so a model can learn them and the loss falls.
``get_batch`` gathers a whole batch in one indexing operation on any device,
which keeps input generation off the critical path of a GPU benchmark.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class SyntheticImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(
        self,
        num_samples: int = 4096,
        image_size: int = 32,
        num_classes: int = 10,
        *,
        seed: int = 0,
        bank_size: int = 512,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.num_samples = num_samples
        self.bank_size = min(bank_size, num_samples)
        self.images = torch.randn(self.bank_size, 3, image_size, image_size, generator=g)
        # Labels from a fixed random projection of the image: learnable, not noise.
        proj = torch.randn(3 * image_size * image_size, num_classes, generator=g)
        self.bank_labels = (self.images.flatten(1) @ proj).argmax(dim=1)
        self._device_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = index % self.bank_size
        return self.images[j], self.bank_labels[j]

    def get_batch(
        self, indices: list[int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at ``indices``, stacked, on ``device``."""
        key = str(device)
        if key not in self._device_cache:
            self._device_cache[key] = (self.images.to(device), self.bank_labels.to(device))
        images, labels = self._device_cache[key]
        idx = torch.tensor(indices, dtype=torch.long).remainder_(self.bank_size)
        if device.type == "cuda":
            # Pinned + non_blocking: a pageable copy would make the host wait for
            # the previous step's kernels, so it could never run ahead. The
            # caching host allocator keeps the buffer alive until the copy is done.
            idx = idx.pin_memory().to(device, non_blocking=True)
        return images.index_select(0, idx), labels.index_select(0, idx)
