"""The pipeline profiler (``hetero.trainer.pipeline.profile``) on a real model: what it
measures is what the partitioner needs, and the split it leads to follows speed."""

from __future__ import annotations

import time

import torch

from hetero.core.stages import Device, Pipeline, partition
from hetero.trainer.models.repeated import repeated_blocks
from hetero.trainer.models.transformer import build_transformer
from hetero.trainer.pipeline import STATE_BYTES_PER_PARAM, profile, speed_probe


def tiny(layers: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_transformer("gpt2-tiny", max_seq_len=16, n_layers=layers)


def test_profile_counts_each_block_the_repeated_finder_finds_with_its_state() -> None:
    model = tiny()
    ids = torch.randint(0, 256, (2, 17))
    got = profile(model, ids[:, :-1], ids[:, 1:], repeats=1)
    found = repeated_blocks(model)
    assert len(got.blocks) == len(found) == 4
    for cost, (_, block) in zip(got.blocks, found, strict=True):
        assert cost.seconds > 0
        assert cost.activation_bytes > 0
        params = sum(p.numel() for p in block.parameters())
        assert cost.state_bytes == params * STATE_BYTES_PER_PARAM
    # Both ends hold the tied embedding's copy: the tail's state counts it.
    emb = model.tok_emb.weight.numel() * STATE_BYTES_PER_PARAM
    assert got.head.state_bytes >= emb and got.tail.state_bytes >= emb


def test_saved_activations_grow_with_the_microbatch() -> None:
    model = tiny()
    one = profile(model, torch.randint(0, 256, (1, 16)), torch.randint(0, 256, (1, 16)), repeats=1)
    four = profile(model, torch.randint(0, 256, (4, 16)), torch.randint(0, 256, (4, 16)), repeats=1)
    # Per sample, the same bytes whatever the microbatch (activations are linear in it).
    for a, b in zip(one.blocks, four.blocks, strict=True):
        assert a.activation_bytes == b.activation_bytes


def test_a_profiled_model_splits_toward_the_faster_device() -> None:
    ids = torch.randint(0, 256, (2, 17))
    model = profile(tiny(8), ids[:, :-1], ids[:, 1:])
    fast_first = partition(model, [Device(4.0, 2**40), Device(1.0, 2**40)], Pipeline(4, 2))
    fast_last = partition(model, [Device(1.0, 2**40), Device(4.0, 2**40)], Pipeline(4, 2))
    # The first stage takes more blocks when it is the fast one than when it is the slow
    # one (how many depends on the head's and the tail's measured share).
    assert fast_first.sizes[0] > fast_last.sizes[0]
    assert fast_first.sizes[0] > fast_first.sizes[1]


class _Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class _Mine(torch.nn.Module):
    """A user's model: embedding, 5 blocks, an output layer tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.layers = torch.nn.ModuleList(_Block(16) for _ in range(5))
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def test_a_users_model_is_profiled_through_its_own_forward() -> None:
    torch.manual_seed(0)
    model = _Mine()
    ids = torch.randint(0, 64, (2, 9))
    got = profile(model, ids[:, :-1], ids[:, 1:], repeats=1)
    assert len(got.blocks) == 5
    assert all(b.seconds > 0 and b.activation_bytes > 0 for b in got.blocks)
    block_state = sum(p.numel() for p in model.layers[0].parameters()) * STATE_BYTES_PER_PARAM
    assert got.blocks[0].state_bytes == block_state
    # The embedding runs before the first block, the tied output layer after the last.
    emb = model.embed.weight.numel() * STATE_BYTES_PER_PARAM
    assert got.head.state_bytes == emb and got.tail.state_bytes == emb
    assert got.head.seconds > 0 and got.tail.seconds >= 0


def test_the_speed_probe_runs_the_block_back_to_back_for_each_window() -> None:
    """As a stage runs its blocks: a window is at least 3 forward-and-backward runs with no
    wait between them (a shared GPU's time slices show only so), sized from one run to
    last about ``window_s`` (not asserted: a loaded host makes that run slow), the model
    untouched."""
    model = tiny()
    block = repeated_blocks(model)[0][1]
    calls = [0]
    block.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))  # copied too
    before = [p.detach().clone() for p in model.parameters()]
    start = time.perf_counter()
    seconds = speed_probe(model, torch.randint(0, 256, (2, 16)), torch.device("cpu"), window_s=0.05)
    took = time.perf_counter() - start
    assert seconds > 0
    assert calls[0] >= 2 + 3 * 3  # a warm-up and a sizing run, then 3 windows of 3 or more
    runs = (calls[0] - 2) // 3
    # Each run's seconds, not a window's: the median window (runs x seconds) lasted no longer
    # than the whole probe. A window's seconds would make this runs x window > 3 windows.
    assert seconds * runs <= took
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
