"""The model-zoo workloads: both data paths give the same samples, the token file round
trip, and the torchvision fallback when timm is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hetero.bench.zoo.tokens import write_tokens
from hetero.bench.zoo.workloads import (
    DeviceImages,
    DeviceTokens,
    MemoryImages,
    TokenWindows,
    build_model,
)
from hetero.core.errors import ConfigError


def test_images_decode_per_sample_and_the_device_twin_gathers_the_same_samples() -> None:
    images = MemoryImages(64, 16, 5, seed=1, bank_size=32)
    x, y = images[3]
    assert x.dtype == torch.float32 and x.shape == (3, 16, 16) and 0 <= int(y) < 5
    raw = torch.from_numpy(images.images[3]).permute(2, 0, 1).float()
    expected = (raw - images.mean) / images.std
    assert torch.allclose(x, expected) or torch.allclose(x, expected.flip(-1))
    xs, ys = DeviceImages(images).get_batch([3, 35, 7], torch.device("cpu"))
    assert xs.shape == (3, 3, 16, 16) and ys.tolist() == [int(images[i][1]) for i in (3, 35, 7)]
    assert torch.allclose(xs[1], xs[0]) or torch.allclose(xs[1], xs[0].flip(-1))  # 35 = 3 mod 32


def test_the_token_file_is_read_in_windows_of_seq_len_plus_one(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("hetero balances ranks. " * 20)
    header = write_tokens(tmp_path / "t.bin", 1000, text=text)
    assert header["dtype"] == "uint16" and header["vocab_size"] == 256
    raw = np.fromfile(tmp_path / "t.bin", dtype=np.uint16)
    assert len(raw) == 1000 and bytes(raw[:6].astype(np.uint8)) == b"hetero"
    windows = TokenWindows(tmp_path / "t.bin", 16)
    assert len(windows) == (1000 - 1) // 16
    x, y = windows[2]
    assert x.tolist() == raw[32:48].tolist() and y.tolist() == raw[33:49].tolist()
    xs, ys = DeviceTokens(windows).get_batch([2, 0], torch.device("cpu"))
    assert xs[0].tolist() == x.tolist() and ys[1].tolist() == windows[0][1].tolist()
    with pytest.raises(ConfigError, match=r"write it with python -m hetero\.bench\.zoo\.tokens"):
        TokenWindows(tmp_path / "missing.bin", 16)


def test_without_timm_a_zoo_name_falls_back_to_torchvision_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torchvision")
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    model, source = build_model("convnext_tiny", 10, 32)
    assert "torchvision" in source and "convnext_tiny (timm not installed)" in source
    assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    with pytest.raises(ConfigError, match="needs timm"):
        build_model("efficientnet_b0", 10, 32)
    _, builtin = build_model("simple_cnn", 10, 32)
    assert builtin == "hetero.trainer.models simple_cnn"
