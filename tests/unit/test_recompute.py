"""Activation checkpointing: the built-in models give the same gradients and buffers with
it as without, keep fewer activations, and the rule that turns it on per rank."""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
from torch import nn

from hetero.core.memfit import capped_step_time, recompute_wanted
from hetero.trainer.activations import RecomputeChoice
from hetero.trainer.models import build_model
from hetero.trainer.models.recompute import Blocks, recomputing, set_recompute, switches

#: One model of each family, at a size a CPU runs in a moment: (name, input size).
FAMILIES = [("debug", 8), ("simple_cnn", 32), ("resnet18", 32), ("resnet50", 32), ("gpt2-tiny", 16)]


def _batch(name: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if name.startswith("gpt2"):
        x = torch.randint(0, 256, (4, size), generator=g)
        return x, x
    return torch.randn(4, 3, size, size, generator=g), torch.randint(0, 10, (4,), generator=g)


def _loss(name: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if name.startswith("gpt2"):
        return nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
    return nn.functional.cross_entropy(out, y)


@functools.cache
def _built(name: str, size: int) -> nn.Module:
    """The model as seed 0 builds it, once per family: initialising resnet50's 25M
    parameters costs more than copying them."""
    torch.manual_seed(0)
    return build_model(name, 10, size)


def _step(
    name: str, size: int, on: bool
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], int]:
    """Gradients and state after one forward and backward from seed 0's model (a fresh
    copy each time), and the bytes of the tensors autograd kept outside any recomputed
    block."""
    model = copy.deepcopy(_built(name, size)).train()
    assert set_recompute(model, on) and recomputing(model) == on
    x, y = _batch(name, size)
    kept = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = _loss(name, model(x), y)
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros(()) for p in model.parameters()]
    return grads, {k: v.clone() for k, v in model.state_dict().items()}, kept


@pytest.mark.parametrize(("name", "size"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_recomputing_gives_the_same_gradients_and_buffers_and_keeps_less(
    name: str, size: int
) -> None:
    """BatchNorm's running statistics are updated once, not again by the recomputation."""
    plain, plain_state, plain_kept = _step(name, size, False)
    again, state, kept = _step(name, size, True)
    for a, b in zip(plain, again, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert state.keys() == plain_state.keys()
    for key, value in plain_state.items():
        assert torch.equal(state[key], value), key
    assert kept < plain_kept / 2, (kept, plain_kept)


def test_a_model_recomputes_only_in_training_with_autograd_recording(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hetero.trainer.models import recompute

    calls: list[int] = []
    real = recompute.checkpoint

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(recompute, "checkpoint", counted)
    model = build_model("debug", 10, 8)
    set_recompute(model, True)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        model(x)
    model.eval()
    model(x)
    assert calls == []
    model.train()
    model(x)
    assert calls == [1]  # the debug model's one conv block


def test_blocks_keep_the_parameter_names_of_a_plain_sequential() -> None:
    layers = [nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)]
    assert Blocks(*layers).state_dict().keys() == nn.Sequential(*layers).state_dict().keys()
    assert Blocks(*layers).ends == (1, 2, 3)
    with pytest.raises(ValueError, match="do not cover 3 layers"):
        Blocks(*layers, ends=(1,))
    resnet = build_model("resnet18", 10, 32)
    assert "layer1.0.conv1.weight" in resnet.state_dict() and len(switches(resnet)) == 4


# ---- the rule: which ranks turn it on -------------------------------------------------------


def test_the_capped_step_time_fills_the_ranks_without_a_cap() -> None:
    assert capped_step_time([None, None], [24, 24]) == 1.0
    assert capped_step_time([None, 30], [24, 24]) == 1.0  # the cap does not bind
    assert capped_step_time([None, 5], [24, 24]) == pytest.approx(43 / 24)
    # Rank 1's cap binds first, then rank 2's at the higher time: water-filling.
    assert capped_step_time([None, 4, 20], [16, 16, 16]) == pytest.approx(24 / 16)
    assert math.isinf(capped_step_time([10, 10], [24, 24]))  # 20 cannot hold 48


@pytest.mark.parametrize(
    ("caps", "wanted", "min_batch", "turned"),
    [
        ((None, 5), (24, 24), 1, (False, True)),  # binds hard: 43/24 · 24 · 3/4 = 32 > 5
        ((None, 23), (24, 24), 1, (False, False)),  # binds a little: 25 · 3/4 < 23
        ((None, 30), (24, 24), 1, (False, False)),  # does not bind
        ((10, 10), (24, 24), 1, (True, True)),  # the caps cannot hold the global batch
        ((None, 0), (24, 24), 1, (False, True)),  # cannot hold min_batch
        ((None, 2), (2, 46), 4, (False, True)),  # below min_batch though above its share
    ],
)
def test_a_rank_recomputes_only_where_its_cap_costs_more_than_recomputing_would(
    caps: tuple[int | None, ...],
    wanted: tuple[int, ...],
    min_batch: int,
    turned: tuple[bool, ...],
) -> None:
    assert recompute_wanted(caps, wanted, min_batch) == turned


def test_the_choice_says_which_ranks_recompute_and_why() -> None:
    choice = RecomputeChoice("auto", (False, True), ("off: no memory cap measured", "on: x"))
    assert choice.text() == "rank 1 on: x"
    assert RecomputeChoice.from_dict(choice.as_dict()) == choice
    off = RecomputeChoice("off", (False, False), ("off: activation_checkpointing off",) * 2)
    assert off.text() == "off on every rank (activation_checkpointing off)"
