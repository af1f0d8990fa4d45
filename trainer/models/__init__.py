"""Built-in models, by name. ``build_model("resnet50", num_classes=10)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from hetero.core.errors import ConfigError
from hetero.trainer.models.transformer import CONFIGS, build_transformer
from hetero.trainer.models.vision import DebugNet, SimpleCNN, resnet


@dataclass(frozen=True)
class ModelInfo:
    """What a built-in job needs to know about a model.

    ``build(num_classes, size)``: ``size`` is pixels per side for image models
    and tokens per sample for language models (whose vocabulary is their own,
    so ``num_classes`` is ignored). ``task`` names how the loss is computed
    (``hetero.trainer.tasks``).
    """

    build: Callable[[int, int], nn.Module]
    default_image_size: int  # language models: default tokens per sample
    has_batchnorm: bool
    task: str = "classification"


MODELS: dict[str, ModelInfo] = {
    "debug": ModelInfo(lambda n, s: DebugNet(n, s), 8, False),
    "simple_cnn": ModelInfo(lambda n, s: SimpleCNN(n), 32, True),
    "resnet18": ModelInfo(lambda n, s: resnet(18, n), 224, True),
    "resnet50": ModelInfo(lambda n, s: resnet(50, n), 224, True),
}


def _language_model(name: str) -> ModelInfo:
    cfg = CONFIGS[name]
    task = "causal-lm" if cfg.causal else "masked-lm"
    return ModelInfo(lambda n, s: build_transformer(name), cfg.seq_len, False, task)


MODELS.update({name: _language_model(name) for name in CONFIGS})


def model_info(name: str) -> ModelInfo:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})") from None


def build_model(name: str, num_classes: int = 10, image_size: int | None = None) -> nn.Module:
    info = model_info(name)
    return info.build(num_classes, image_size or info.default_image_size)


__all__ = ["MODELS", "ModelInfo", "build_model", "model_info"]
