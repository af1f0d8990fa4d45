"""Built-in models, by name: the implementations of the catalogue's models.

``hetero.core.catalogue`` describes each model (kind, task, default size);
this package registers how to build it (with torch). ``BUILDERS`` must name
exactly the catalogue's models, which a test checks.
``build_model("resnet50", num_classes=10)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from hetero.core import catalogue
from hetero.trainer.models.transformer import CONFIGS, build_transformer
from hetero.trainer.models.vision import DebugNet, SimpleCNN, resnet

#: ``build(num_classes, size)``: ``size`` is pixels per side for image models and tokens
#: per sample for language models (whose vocabulary is their own, so ``num_classes`` is
#: ignored).
Builder = Callable[[int, int], nn.Module]

BUILDERS: dict[str, Builder] = {
    "debug": lambda n, s: DebugNet(n, s),
    "simple_cnn": lambda n, s: SimpleCNN(n),
    "resnet18": lambda n, s: resnet(18, n),
    "resnet50": lambda n, s: resnet(50, n),
}


def _transformer(name: str) -> Builder:
    return lambda n, s: build_transformer(name)


BUILDERS.update({name: _transformer(name) for name in CONFIGS})


@dataclass(frozen=True)
class ModelInfo:
    """What a built-in job needs to know about a model: the catalogue's entry and a builder.

    ``task`` names how the loss is computed (``hetero.trainer.tasks``).
    """

    build: Builder
    default_image_size: int  # language models: default tokens per sample
    has_batchnorm: bool
    task: str = "classification"


MODELS: dict[str, ModelInfo] = {
    entry.name: ModelInfo(BUILDERS[entry.name], entry.default_size, entry.has_batchnorm, entry.task)
    for entry in catalogue.MODELS
}


def model_info(name: str) -> ModelInfo:
    catalogue.model(name)  # an unknown name: a ConfigError with a hint
    return MODELS[name]


def build_model(name: str, num_classes: int = 10, image_size: int | None = None) -> nn.Module:
    info = model_info(name)
    return info.build(num_classes, image_size or info.default_image_size)


__all__ = ["BUILDERS", "MODELS", "ModelInfo", "build_model", "model_info"]
