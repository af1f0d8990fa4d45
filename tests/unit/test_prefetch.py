"""Moving a loader's batches to the device: any nesting of tensors, other leaves kept."""

from __future__ import annotations

import collections

import torch

from hetero.trainer.prefetch import tensors_in, to_device


def test_to_device_keeps_any_nesting_and_finds_every_tensor():
    Pair = collections.namedtuple("Pair", "x y")
    batch = {"a": [torch.ones(2), (torch.zeros(1), "label")], "b": Pair(torch.ones(3), 7)}
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved["b"], Pair) and moved["b"].y == 7
    assert isinstance(moved["a"], list) and moved["a"][1][1] == "label"
    assert [t.numel() for t in tensors_in(moved)] == [2, 1, 3]
