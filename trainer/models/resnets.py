"""torchvision's ResNet-18/50 whose residual blocks can be recomputed in backward.

Built as ``torchvision.models.resnet18``/``resnet50`` with ``weights=None`` (the same
blocks, layers and initialisation, so the same parameters from the same seed); each
stage's ``Sequential`` becomes a ``Blocks`` of the same residual blocks, one block
each, so the parameters keep their names. The stem (conv, BatchNorm, pooling) is not
recomputed: its conv and BatchNorm are separate FSDP2 units, and a recomputed run
must lie inside one (``trainer.models.recompute``).
"""

from __future__ import annotations

from torch import nn
from torchvision.models import resnet18, resnet50

from hetero.trainer.models.recompute import Blocks

STAGES = ("layer1", "layer2", "layer3", "layer4")


def resnet(depth: int, num_classes: int) -> nn.Module:
    """ResNet-``depth`` (18 or 50) with random weights and ``num_classes`` outputs."""
    model = {18: resnet18, 50: resnet50}[depth](weights=None, num_classes=num_classes)
    for name in STAGES:
        stage = getattr(model, name)
        setattr(model, name, Blocks(*stage.children()))
    return model
