"""The built-in models, datasets and policies, by name: what every entry point may name.

These are descriptions, not implementations. ``hetero.trainer.models`` and
``hetero.trainer.datasets`` register a builder (which needs torch) against each
name here, and a test checks that the two sets are equal; ``hetero.core.balancer``
implements the policies, and a test checks those names too. job.yaml,
``hetero-train`` and the Python API read their choices from this module, so a
model added here is a model every way in accepts.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from hetero.core.errors import ConfigError

Kind = Literal["image", "text"]


@dataclass(frozen=True)
class ModelEntry:
    """A built-in model.

    ``default_size`` is pixels per side for image models and tokens per sample
    for language models (the ``image_size`` / ``seq_len`` a job gets when it
    sets none); ``max_seq_len`` is a language model's number of positions (a
    longer ``seq_len`` is an error). ``task`` names how the loss is computed
    (``hetero.trainer.tasks``).
    """

    name: str
    kind: Kind
    task: str
    default_size: int
    summary: str
    has_batchnorm: bool = False
    max_seq_len: int | None = None
    #: Parameters at the default size and 10 classes (the trainer's models, checked by a
    #: test): what the training state's bytes are predicted from before a run.
    parameters: int = 0
    #: FLOPs of one sample's forward and backward pass at the default size and 10
    #: classes (torch's ``FlopCounterMode`` on the trainer's models, checked by a test):
    #: with the devices' matmul rates, what a step's compute is weighed against the
    #: all-reduce with before a run (``core.balancer.firstplan``). 0: unknown.
    train_flops: int = 0

    def train_flops_at(self, size: int | None) -> float:
        """``train_flops`` at ``size`` (pixels per side, tokens per sample; None: the
        default): an image model's FLOPs grow with its pixels, a language model's with
        its tokens (the attention's quadratic part, an eighth of GPT-2's at 1,024
        tokens, is left out: a weight, not a forecast)."""
        if not size or size == self.default_size:
            return float(self.train_flops)
        ratio = size / self.default_size
        return self.train_flops * (ratio * ratio if self.kind == "image" else ratio)

    @property
    def channels_last_applies(self) -> bool:
        """Convolutional image models gain from the NHWC layout; transformers have none."""
        return self.kind == "image"

    @property
    def transformer(self) -> bool:
        return self.kind == "text"


MODELS: tuple[ModelEntry, ...] = (
    ModelEntry(
        "debug",
        "image",
        "classification",
        8,
        "a conv and a linear layer, for tests",
        parameters=762,
        train_flops=31_488,
    ),
    ModelEntry(
        "simple_cnn",
        "image",
        "classification",
        32,
        "two conv blocks, 32 px",
        True,
        parameters=152_074,
        train_flops=32_644_608,
    ),
    ModelEntry(
        "resnet18",
        "image",
        "classification",
        224,
        "torchvision ResNet-18",
        True,
        parameters=11_181_642,
        train_flops=10_645_370_880,
    ),
    ModelEntry(
        "resnet50",
        "image",
        "classification",
        224,
        "torchvision ResNet-50",
        True,
        parameters=23_528_522,
        train_flops=24_286_912_512,
    ),
    ModelEntry(
        "gpt2-small",
        "text",
        "causal-lm",
        1024,
        "GPT-2 124M, causal LM",
        max_seq_len=1024,
        parameters=124_439_808,
        train_flops=874_944_921_600,
    ),
    ModelEntry(
        "gpt2-medium",
        "text",
        "causal-lm",
        1024,
        "GPT-2 355M, causal LM (24 layers)",
        max_seq_len=1024,
        parameters=354_823_168,
        train_flops=2_480_853_221_376,
    ),
    ModelEntry(
        "gpt2-large",
        "text",
        "causal-lm",
        1024,
        "GPT-2 774M, causal LM (36 layers)",
        max_seq_len=1024,
        parameters=774_030_080,
        train_flops=5_323_712_102_400,
    ),
    ModelEntry(
        "gpt2-tiny",
        "text",
        "causal-lm",
        64,
        "2-layer GPT-2, for tests",
        max_seq_len=64,
        parameters=120_576,
        train_flops=50_331_648,
    ),
    ModelEntry(
        "bert-base",
        "text",
        "masked-lm",
        128,
        "BERT-base 110M, masked LM",
        max_seq_len=512,
        parameters=109_512_762,
        train_flops=85_497_348_096,
    ),
    ModelEntry(
        "bert-tiny",
        "text",
        "masked-lm",
        64,
        "2-layer BERT, for tests",
        max_seq_len=64,
        parameters=125_185,
        train_flops=51_929_088,
    ),
)


@dataclass(frozen=True)
class DatasetEntry:
    """A built-in dataset.

    ``size`` says how many samples one epoch has (the trainer counts
    ``epochs`` in those samples once the dataset is built); ``needs_data_dir``
    whether it reads ``data_dir``, which datasets that generate their samples
    refuse.
    """

    name: str
    kind: Kind
    needs_data_dir: bool
    size: str
    summary: str


DATASETS: tuple[DatasetEntry, ...] = (
    DatasetEntry(
        "synthetic", "image", False, "num_samples", "seeded random images with learnable labels"
    ),
    DatasetEntry(
        "imagefolder", "image", True, "the image files under data_dir", "data_dir/<class>/<image>"
    ),
    DatasetEntry("cifar10", "image", True, "50,000 (training split)", "CIFAR-10 python batches"),
    DatasetEntry("cifar100", "image", True, "50,000 (training split)", "CIFAR-100 python batches"),
    DatasetEntry(
        "synthetic-text", "text", False, "num_samples", "seeded random token windows of seq_len"
    ),
    DatasetEntry(
        "text",
        "text",
        True,
        "bytes of data_dir divided into windows of seq_len + 1",
        "a UTF-8 file, or a folder of *.txt, as bytes",
    ),
)

#: Other names of datasets, as the origin documents spell them; every entry point accepts them.
DATASET_ALIASES: dict[str, str] = {"synthetic_image": "synthetic"}


@dataclass(frozen=True)
class PolicyEntry:
    """A balancer policy (implemented in ``hetero.core.balancer``)."""

    name: str
    summary: str


POLICIES: tuple[PolicyEntry, ...] = (
    PolicyEntry("equal", "the same batch on every rank: what plain DDP does"),
    PolicyEntry("proportional", "batches in proportion to each rank's compute score"),
    PolicyEntry(
        "dynamic", "re-planned from each rank's measured compute time, for equal step time"
    ),
    PolicyEntry(
        "hybrid",
        "dynamic, starting from the compute scores and leaning on them while few intervals are measured",
    ),
)

MODEL_NAMES: tuple[str, ...] = tuple(m.name for m in MODELS)
DATASET_NAMES: tuple[str, ...] = tuple(d.name for d in DATASETS)
POLICY_NAMES: tuple[str, ...] = tuple(p.name for p in POLICIES)


def model(name: str) -> ModelEntry:
    """The model called ``name``; an unknown name is a ``ConfigError`` with a hint."""
    for entry in MODELS:
        if entry.name == name:
            return entry
    raise ConfigError(f"unknown model {name!r}{did_you_mean(name, MODEL_NAMES)}")


def dataset(name: str) -> DatasetEntry:
    """The dataset called ``name`` (or one of its aliases)."""
    canonical = DATASET_ALIASES.get(name, name)
    for entry in DATASETS:
        if entry.name == canonical:
            return entry
    raise ConfigError(f"unknown dataset {name!r}{did_you_mean(name, DATASET_NAMES)}")


def default_dataset(model_name: str) -> str:
    """The dataset a job gets when it names none: synthetic data of the model's kind."""
    return "synthetic-text" if model(model_name).kind == "text" else "synthetic"


def did_you_mean(word: str, known: tuple[str, ...] | list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known word, or nothing."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
