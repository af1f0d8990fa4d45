"""The ``jpeg`` data path: JPEG files in memory, decoded and augmented per sample in workers.

What an ImageNet training script's ``Dataset`` does, minus the disk: each
``__getitem__`` opens one JPEG with PIL, converts it to RGB and applies
torchvision's reference training recipe (``references/classification/presets.py``):
``RandomResizedCrop(image_size)`` (bilinear, antialiased), ``RandomHorizontalFlip``,
``PILToTensor``, ``ToDtype(float32, scale=True)``, ``Normalize`` with ImageNet's
mean and std. A ``DataLoader``'s workers do this; the loop receives float
batches as from any torchvision pipeline.

The files: ``bank_size`` distinct JPEGs (quality 90, 4:2:0) made once from the
seed, sample *i* being file ``i mod bank_size``. Their sides are drawn from
``[min_side, max_side]`` (default 320–480 px: ImageNet's training images average
about 470 × 390) and their content is photograph-like where it sets JPEG's cost:
a 1/f ("pink") noise texture over eight octaves (every scale of detail, as in
natural images, so the entropy coder has as many bits to decode as on a photo,
about 3 bits per pixel against ImageNet's ~4), recoloured per image, with a few
flat shapes of hard edges on top. Random pixels would cost more to decode than any
photograph; flat colours far less. Building 256 files takes about 2 s on one
core (textures once, then a crop, a colour mix and an encode per file).

The label of a file is ``index mod num_classes``: a fixed function of the image,
so the loss falls as the model learns the bank.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.nn import functional as F
from torch.utils.data import Dataset

from hetero.core.errors import ConfigError

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
QUALITY = 90
#: Noise textures the files are cut from (each file: its own crop and colours), at
#: most ``MAX_TEXTURE_SIDE`` px square and at least twice the largest file's side.
TEXTURES = 3
MAX_TEXTURE_SIDE = 1024
#: Amplitude of each octave against the next coarser one: 1/f-like detail.
OCTAVE_GAIN = 0.8


def recipe(image_size: int) -> torch.nn.Module:
    """torchvision's reference ImageNet training transform at ``image_size``."""
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomResizedCrop(image_size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def _textures(count: int, side: int, generator: torch.Generator) -> np.ndarray:
    """``count`` 3-channel pink-noise textures ``side`` px square, unit variance."""
    img = torch.zeros(count, 3, side, side)
    amp, scale = 1.0, 128
    while scale >= 1:
        n = side // scale + 1
        noise = torch.randn(count, 3, n, n, generator=generator)
        if scale > 1:
            noise = F.interpolate(noise, size=(side, side), mode="bicubic", align_corners=False)
        img += amp * noise[:, :, :side, :side]
        amp *= OCTAVE_GAIN
        scale //= 2
    return (img / img.std()).numpy()


def make_jpegs(
    count: int, *, seed: int = 0, min_side: int = 320, max_side: int = 480
) -> list[bytes]:
    """``count`` distinct JPEG files (module doc), the same for the same arguments."""
    if not 16 <= min_side <= max_side <= MAX_TEXTURE_SIDE // 2:
        raise ConfigError(
            f"jpeg sides must satisfy 16 <= min <= max <= {MAX_TEXTURE_SIDE // 2}, "
            f"got {min_side}-{max_side}"
        )
    rng = np.random.default_rng(seed)
    side = 1 << (2 * max_side - 1).bit_length()  # a power of two >= 2 x max_side
    textures = _textures(TEXTURES, side, torch.Generator().manual_seed(seed))
    files = []
    for _ in range(count):
        h, w = (int(v) for v in rng.integers(min_side, max_side + 1, 2))
        y, x = (int(v) for v in rng.integers(0, side - max_side, 2))
        patch = textures[int(rng.integers(0, TEXTURES)), :, y : y + h, x : x + w]
        mix = rng.standard_normal((3, 3)).astype(np.float32) * 0.5 + np.eye(3, dtype=np.float32)
        rgb = np.einsum("ij,jhw->hwi", mix, patch) * 45.0 + rng.uniform(60, 190, 3)
        image = Image.fromarray(rgb.clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 7))):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            box = (x0, y0, x0 + int(rng.integers(20, 160)), y0 + int(rng.integers(20, 160)))
            fill = tuple(int(v) for v in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=QUALITY)
        files.append(buf.getvalue())
    return files


class JpegImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``num_samples`` samples over ``bank_size`` JPEG files, decoded and augmented per
    sample (module doc). Float CHW ``image_size``² tensors, normalised."""

    def __init__(
        self,
        num_samples: int,
        image_size: int,
        num_classes: int,
        *,
        seed: int = 0,
        bank_size: int = 256,
        min_side: int = 320,
        max_side: int = 480,
    ) -> None:
        self.num_samples = num_samples
        self.image_size = image_size
        self.num_classes = num_classes
        self.files = make_jpegs(
            min(bank_size, num_samples), seed=seed, min_side=min_side, max_side=max_side
        )
        self.transform = recipe(image_size)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = index % len(self.files)
        with Image.open(io.BytesIO(self.files[j])) as f:
            image = f.convert("RGB")
        return self.transform(image), torch.tensor(j % self.num_classes)

    def describe(self) -> str:
        kb = sum(len(f) for f in self.files) / len(self.files) / 1e3
        return (
            f"{self.num_samples} samples over {len(self.files)} JPEG files in memory "
            f"(mean {kb:.0f} KB), PIL decode + RandomResizedCrop({self.image_size}) + flip + "
            "normalize per sample in the workers"
        )
