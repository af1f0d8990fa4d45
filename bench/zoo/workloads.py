"""The models and datasets of the model-zoo scenarios, as a user's script would build them.

Models: a name from timm (``vit_base_patch16_224``, ``convnext_base``, …) when
timm is installed (the ``bench`` extra); without timm, torchvision's model of
the same family (``vit_b_16``, ``convnext_base``), said in the output; hetero's
built-in models by their names (``gpt2-small``, ``simple_cnn``, …: no download,
no dependency). :func:`build_model` returns the model and a line saying where it
came from.

Data, each an ordinary map-style ``Dataset`` (the ``loader`` path: a
``DataLoader`` with workers does the per-sample work) with a GPU-resident twin
(the ``device`` path: ``get_batch(indices, device)`` gathers a batch on the
device, no workers), and the ``jpeg`` path (``zoo.jpeg``: JPEG files decoded and
augmented per sample in the workers, the ImageNet recipe):

- images: a bank of uint8 HWC images in memory; each sample is decoded like a
  real pipeline on the CPU (uint8 HWC → float CHW, normalised with ImageNet's
  mean and std, random horizontal flip). Labels are a fixed function of the
  image, so the loss falls;
- tokens: a file of uint16 (or uint32) token ids on disk written by
  ``hetero.bench.zoo.tokens``, read through ``np.memmap``; sample *i* is the
  window of ``seq_len + 1`` tokens at ``i · seq_len`` (input and next-token
  target).

On the DataLoader paths (``loader``, ``jpeg``) :class:`Delayed` adds what
``zoo.delays`` describes per sample in the workers: a seeded heavy-tailed
jitter and an EMULATED per-rank decode cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from hetero.bench.zoo import LOADER_PATHS
from hetero.bench.zoo.delays import InputCost, Jitter, busy_wait
from hetero.core.errors import ConfigError

#: torchvision's model of the same family, for a timm name when timm is missing.
TORCHVISION_FALLBACK = {
    "vit_base_patch16_224": "vit_b_16",
    "vit_large_patch16_224": "vit_l_16",
    "convnext_base": "convnext_base",
    "convnext_small": "convnext_small",
    "convnext_tiny": "convnext_tiny",
    "swin_tiny_patch4_window7_224": "swin_t",
}
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def is_language_model(name: str) -> bool:
    from hetero.trainer.models import MODELS

    return name in MODELS and MODELS[name].task == "causal-lm"


def build_model(name: str, num_classes: int, image_size: int) -> tuple[nn.Module, str]:
    """The model called ``name`` and where it came from (one line for the output)."""
    from hetero.trainer.models import MODELS

    if name in MODELS:
        return MODELS[name].build(num_classes, image_size), f"hetero.trainer.models {name}"
    try:
        import timm
    except ImportError:
        return _torchvision(name, num_classes)
    try:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes)
    except RuntimeError as exc:  # timm's "Unknown model"
        raise ConfigError(f"timm has no model {name!r}: {exc}") from None
    return model, f"timm {_version('timm')} {name}"


def _torchvision(name: str, num_classes: int) -> tuple[nn.Module, str]:
    """torchvision's model of the same family as timm's ``name`` (timm is not installed)."""
    fallback = TORCHVISION_FALLBACK.get(name)
    if fallback is None:
        raise ConfigError(
            f"model {name!r} needs timm (pip install 'hetero[bench]'); without it the "
            f"fallbacks are {', '.join(sorted(TORCHVISION_FALLBACK))}"
        )
    try:
        import torchvision
    except ImportError:
        raise ConfigError(
            f"model {name!r} needs timm or torchvision; neither is installed"
        ) from None
    model = torchvision.models.get_model(fallback, num_classes=num_classes)
    return model, f"torchvision {_version('torchvision')} {fallback} (timm not installed)"


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for classifier logits ``(N, C)`` and language-model logits ``(N, T, V)``."""
    if output.dim() == 3:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return F.cross_entropy(output, target)


# -- images -----------------------------------------------------------------------------


class MemoryImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``num_samples`` images from a bank of ``bank_size`` uint8 HWC images, decoded per sample.

    Sample ``i`` is image ``i mod bank_size`` (the same on every rank). The label
    is a fixed random projection of the image, argmax over ``num_classes``.
    """

    def __init__(
        self,
        num_samples: int,
        image_size: int,
        num_classes: int,
        *,
        seed: int = 0,
        bank_size: int = 512,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.num_samples = num_samples
        bank = min(bank_size, num_samples)
        self.images = rng.integers(0, 256, (bank, image_size, image_size, 3), dtype=np.uint8)
        proj = rng.standard_normal((16 * 16 * 3, num_classes)).astype(np.float32)
        small = self.images[:, :: max(image_size // 16, 1), :: max(image_size // 16, 1)]
        small = small[:, :16, :16].reshape(bank, -1).astype(np.float32)
        self.labels = np.asarray((small - 127.5) @ proj[: small.shape[1]]).argmax(1)
        self.mean = torch.tensor(MEAN).view(3, 1, 1) * 255.0
        self.std = torch.tensor(STD).view(3, 1, 1) * 255.0

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = index % len(self.images)
        x = torch.from_numpy(self.images[j]).permute(2, 0, 1).float()  # HWC uint8 -> CHW float
        x = (x - self.mean) / self.std
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x.contiguous(), torch.tensor(int(self.labels[j]))


class DeviceImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The same samples as :class:`MemoryImages`, normalised once and kept on the device."""

    def __init__(self, source: MemoryImages) -> None:
        self.source = source
        self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.source[index]

    def get_batch(
        self, indices: list[int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._cache:
            raw = torch.from_numpy(self.source.images).to(device).permute(0, 3, 1, 2).float()
            mean, std = self.source.mean.to(device), self.source.std.to(device)
            labels = torch.from_numpy(self.source.labels).long().to(device)
            self._cache[key] = ((raw - mean) / std, labels)
        images, labels = self._cache[key]
        idx = torch.tensor(indices, dtype=torch.long).remainder_(len(images))
        if device.type == "cuda":
            idx = idx.pin_memory().to(device, non_blocking=True)
        x = images.index_select(0, idx)
        flip = torch.rand(len(indices), device=device) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        return x, labels.index_select(0, idx)


# -- tokens -----------------------------------------------------------------------------


def read_header(path: Path) -> dict[str, Any]:
    """The token file's header (``PATH.json``: dtype, vocabulary, tokenizer, count)."""
    meta = Path(f"{path}.json")
    if not Path(path).is_file() or not meta.is_file():
        raise ConfigError(
            f"token file {path} (and {meta}) not found: write it with "
            "python -m hetero.bench.zoo.tokens --out PATH"
        )
    header: dict[str, Any] = json.loads(meta.read_text())
    return header


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of ``seq_len + 1`` tokens from a token file on disk (``np.memmap``)."""

    def __init__(self, path: Path, seq_len: int) -> None:
        self.path = Path(path)
        self.header = read_header(self.path)
        self.seq_len = seq_len
        self.tokens = np.memmap(self.path, dtype=np.dtype(self.header["dtype"]), mode="r")
        self.windows = (len(self.tokens) - 1) // seq_len
        if self.windows < 1:
            raise ConfigError(f"{path} holds {len(self.tokens)} tokens, fewer than {seq_len + 1}")

    @property
    def vocab_size(self) -> int:
        return int(self.header["vocab_size"])

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (index % self.windows) * self.seq_len
        w = torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))
        return w[:-1], w[1:]


class DeviceTokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The same windows as :class:`TokenWindows`, the whole token file on the device."""

    def __init__(self, source: TokenWindows) -> None:
        self.source = source
        self._cache: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.source[index]

    def get_batch(
        self, indices: list[int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._cache:
            self._cache[key] = torch.from_numpy(self.source.tokens.astype(np.int64)).to(device)
        tokens = self._cache[key]
        t = self.source.seq_len
        starts = torch.tensor(indices, dtype=torch.long).remainder_(self.source.windows) * t
        if device.type == "cuda":
            starts = starts.pin_memory().to(device, non_blocking=True)
        w = tokens[starts.view(-1, 1) + torch.arange(t + 1, device=device).view(1, -1)]
        return w[:, :-1], w[:, 1:]


class Delayed(Dataset[Any]):
    """``source`` with ``zoo.delays``' costs added per sample, where ``__getitem__`` runs
    (a DataLoader's workers): first the EMULATED busy-wait of ``input_cost_s``, then
    the sample's ``jitter`` sleep."""

    def __init__(
        self, source: Dataset[Any], *, jitter: Jitter | None, input_cost_s: float, seed: int
    ) -> None:
        self.source = source
        self.jitter = jitter
        self.input_cost_s = input_cost_s
        self.seed = seed

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        if self.input_cost_s > 0:
            busy_wait(self.input_cost_s)
        if self.jitter is not None:
            time.sleep(self.jitter.delay_s(self.seed, index))
        return self.source[index]


def build_data(
    model_name: str,
    *,
    path: str,
    num_samples: int,
    image_size: int,
    num_classes: int,
    tokens: Path | None,
    seq_len: int,
    seed: int = 0,
    rank: int = 0,
    jitter: Jitter | None = None,
    input_cost: InputCost | None = None,
    jpeg_sides: tuple[int, int] = (320, 480),
) -> tuple[Dataset[Any], Callable[[], str]]:
    """The dataset for data ``path`` (``loader``/``jpeg``: per-sample work in workers;
    ``device``: ``get_batch`` on the GPU) and a line describing it. ``jitter`` and
    ``input_cost`` (``rank``'s share of it) apply on the DataLoader paths only."""
    if path not in LOADER_PATHS and (jitter or input_cost):
        raise ConfigError(
            f"--loader-jitter and --input-cost-ms act in DataLoader workers: use --data "
            f"{' or '.join(LOADER_PATHS)}, not {path}"
        )
    dataset, line = _source(
        model_name, path, num_samples, image_size, num_classes, tokens, seq_len, seed, jpeg_sides
    )
    extra = [d.describe() for d in (jitter, input_cost) if d is not None]
    described = (lambda: "; ".join([line(), *extra])) if extra else line
    cost_ms = input_cost.ms_for(rank) if input_cost else 0.0
    if not (jitter or cost_ms):
        return dataset, described  # nothing to add on this rank; the line says the job's
    delayed = Delayed(dataset, jitter=jitter, input_cost_s=cost_ms / 1e3, seed=seed)
    return delayed, described


def _source(
    model_name: str,
    path: str,
    num_samples: int,
    image_size: int,
    num_classes: int,
    tokens: Path | None,
    seq_len: int,
    seed: int,
    jpeg_sides: tuple[int, int] = (320, 480),
) -> tuple[Dataset[Any], Callable[[], str]]:
    if is_language_model(model_name):
        if tokens is None:
            raise ConfigError(f"{model_name} trains on a token file: pass --tokens PATH")
        if path == "jpeg":
            raise ConfigError(f"{model_name} trains on tokens: the jpeg data path is for images")
        windows = TokenWindows(tokens, seq_len)
        h = windows.header

        def text_line() -> str:
            return (
                f"{len(windows)} windows of {seq_len + 1} tokens from {tokens} "
                f"({h['count']:,} {h['dtype']} tokens, {h['tokenizer']})"
            )

        return (windows if path == "loader" else DeviceTokens(windows)), text_line
    if path == "jpeg":
        from hetero.bench.zoo.jpeg import JpegImages

        low, high = jpeg_sides
        jpegs = JpegImages(
            num_samples, image_size, num_classes, seed=seed, min_side=low, max_side=high
        )
        return jpegs, jpegs.describe
    images = MemoryImages(num_samples, image_size, num_classes, seed=seed)

    def image_line() -> str:
        return f"{num_samples} images {image_size}px uint8 in memory, decoded per sample"

    return (images if path == "loader" else DeviceImages(images)), image_line
