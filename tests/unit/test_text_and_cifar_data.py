"""Token datasets (synthetic, byte-level file), masked-LM masking, CIFAR from local files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetero.core.errors import ConfigError
from hetero.trainer.datasets import build_dataset
from hetero.trainer.datasets.cifar import CifarTensors, write_cifar
from hetero.trainer.datasets.text import (
    IGNORE_INDEX,
    ByteText,
    CausalLMSamples,
    MaskedLMSamples,
    SyntheticText,
)

CPU = torch.device("cpu")


def test_synthetic_text_is_the_same_sample_for_the_same_index_everywhere():
    a, b = SyntheticText(100, 12, 50, seed=3), SyntheticText(100, 12, 50, seed=3)
    assert torch.equal(a[17], b[17]) and a[17].shape == (13,)
    assert torch.equal(a.get_batch([17, 3], CPU)[0], a[17])
    assert int(a.get_batch(list(range(100)), CPU).max()) < 50
    assert not torch.equal(a[17], SyntheticText(100, 12, 50, seed=4)[17])


def test_causal_pairs_are_shifted_by_one_token():
    data = CausalLMSamples(SyntheticText(10, 8, 20))
    x, y = data.get_batch([2], CPU)
    assert torch.equal(x[0, 1:], y[0, :-1]) and x.shape == (1, 8)


def test_masked_lm_masking_is_fixed_per_sample_and_never_empty():
    base = SyntheticText(4096, 32, 256, seed=0)
    data = MaskedLMSamples(base, mask_token_id=256, vocab_size=257, seed=7)
    idx = list(range(512))
    x, y = data.get_batch(idx, CPU)
    x2, y2 = data.get_batch(idx[::-1], CPU)
    assert torch.equal(x, x2.flip(0)) and torch.equal(y, y2.flip(0))  # order-independent
    hidden = y != IGNORE_INDEX
    assert hidden.any(dim=1).all()
    assert 0.12 < hidden.float().mean().item() < 0.19
    tokens = base.get_batch(idx, CPU)[:, :-1]
    assert torch.equal(y[hidden], tokens[hidden])
    assert torch.equal(x[~hidden], tokens[~hidden])
    assert 0.7 < (x[hidden] == 256).float().mean().item() < 0.9
    xi, yi = data[5]
    assert torch.equal(xi, x[5]) and torch.equal(yi, y[5])
    with pytest.raises(ConfigError, match="MASK"):
        MaskedLMSamples(base, mask_token_id=100, vocab_size=101)


def test_byte_text_cuts_a_file_into_windows(tmp_path: Path):
    (tmp_path / "a.txt").write_bytes(b"hello world, ")
    (tmp_path / "b.txt").write_bytes(b"hetero text")
    data = ByteText(tmp_path, seq_len=4)
    assert bytes(data[0].tolist()) == b"hello" and bytes(data[1].tolist()) == b"o wor"
    assert len(data) == (24 - 1) // 4
    assert torch.equal(data.get_batch([1], CPU)[0], data[1])
    single = ByteText(tmp_path / "b.txt", seq_len=3)
    assert bytes(single[0].tolist()) == b"hete"
    with pytest.raises(ConfigError, match="does not exist"):
        ByteText(tmp_path / "missing.txt", 4)
    with pytest.raises(ConfigError, match="fewer than one sample"):
        ByteText(tmp_path / "b.txt", 64)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no \*\.txt"):
        ByteText(tmp_path / "empty", 4)


@pytest.mark.parametrize("name,classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_reads_the_official_python_format(tmp_path: Path, name: str, classes: int):
    write_cifar(tmp_path, name, train=23, test=7)
    train = build_dataset(name, image_size=32, num_classes=0, data_dir=tmp_path)
    test = build_dataset(name, image_size=32, num_classes=0, data_dir=tmp_path, train=False)
    assert isinstance(train, CifarTensors) and train.num_classes == classes
    assert len(train) == 23 and len(test) == 7
    x, y = train.get_batch([0, 11, 22], CPU)
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.float32
    assert y.tolist() == [0 % classes, 11 % classes, 22 % classes]
    xi, yi = train[11]
    assert torch.allclose(xi, x[1]) and int(yi) == y[1]


def test_missing_cifar_is_a_one_line_error_naming_the_path(tmp_path: Path):
    with pytest.raises(ConfigError, match=str(tmp_path / "cifar-10-batches-py")):
        build_dataset("cifar10", image_size=32, num_classes=0, data_dir=tmp_path)
    with pytest.raises(ConfigError, match="needs --data-dir"):
        build_dataset("cifar100", image_size=32, num_classes=0)
