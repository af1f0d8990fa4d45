"""Built-in models, by name. ``build_model("resnet50", num_classes=10)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from hetero.errors import ConfigError
from hetero.trainer.models.vision import DebugNet, SimpleCNN, resnet


@dataclass(frozen=True)
class ModelInfo:
    """What a built-in job needs to know about a model."""

    build: Callable[[int, int], nn.Module]  # (num_classes, image_size) -> module
    default_image_size: int
    has_batchnorm: bool


MODELS: dict[str, ModelInfo] = {
    "debug": ModelInfo(lambda n, s: DebugNet(n, s), 8, False),
    "simple_cnn": ModelInfo(lambda n, s: SimpleCNN(n), 32, True),
    "resnet18": ModelInfo(lambda n, s: resnet(18, n), 224, True),
    "resnet50": ModelInfo(lambda n, s: resnet(50, n), 224, True),
}


def model_info(name: str) -> ModelInfo:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})") from None


def build_model(name: str, num_classes: int = 10, image_size: int | None = None) -> nn.Module:
    info = model_info(name)
    return info.build(num_classes, image_size or info.default_image_size)


__all__ = ["MODELS", "ModelInfo", "build_model", "model_info"]
