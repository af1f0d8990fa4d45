"""Image classifiers: a tiny debug model, a small CNN and torchvision ResNets.

All are built from scratch (no weight downloads) and take ``(N, 3, H, W)``
images, returning ``(N, num_classes)`` logits. Each can checkpoint its
activations (``trainer.models.recompute``: a ``Blocks`` container's switch):
the debug model its conv block, the small CNN each of its two conv blocks, a
ResNet each residual block of its four stages.
"""

from __future__ import annotations

import torch
from torch import nn

from hetero.trainer.models.recompute import Blocks


class DebugNet(nn.Module):
    """A few thousand parameters; deterministic and fast, for tests.

    No BatchNorm, so per-rank batches compose exactly into the global batch
    (the gradient-equivalence test relies on it). One conv block (conv, ReLU,
    pooling: one FSDP2 unit, and one block to recompute) and a linear classifier.
    """

    def __init__(self, num_classes: int = 10, image_size: int = 8) -> None:
        super().__init__()
        self.features = Blocks(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), ends=(3,))
        self.fc = nn.Linear(4 * (image_size // 2) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


class SimpleCNN(nn.Module):
    """Two conv blocks and a classifier, sized for 32 px images on a CPU."""

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.features = Blocks(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(4),
            ends=(4, 8),  # the two conv blocks
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 16, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet(depth: int, num_classes: int) -> nn.Module:
    """torchvision's ResNet-18/50 with random weights (``trainer.models.resnets``; torchvision
    is imported when one is built)."""
    from hetero.trainer.models.resnets import resnet as build

    return build(depth, num_classes)
