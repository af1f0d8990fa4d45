"""Activation checkpointing for a model of one's own: model-zoo models (a torchvision
ResNet with BatchNorm, a timm ViT with dropout) get their repeated blocks recomputed
with the gradients and buffers of a plain step and fewer activations kept; the finder's
choices; and ``ctx.wrap``/``probe_memory`` acting on such a model."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import timm
import torch
import torchvision
from torch import nn

from hetero.core.errors import ConfigError
from hetero.trainer.memprobe import INJECT_ENV
from hetero.trainer.models.recompute import recomputing, set_recompute, switches
from hetero.trainer.models.repeated import attach, repeated_blocks
from hetero.trainer.sharding import shard_units
from hetero.trainer.start import init


def _resnet() -> nn.Module:
    return torchvision.models.resnet18(num_classes=10)


def _vit() -> nn.Module:
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        depth=4,
        num_classes=10,
        proj_drop_rate=0.1,
        attn_drop_rate=0.1,
    )


ZOO: list[tuple[str, Callable[[], nn.Module], str]] = [
    ("resnet18", _resnet, "8 BasicBlock: layer1.0 … layer4.1"),
    ("vit", _vit, "4 Block: blocks.0 … blocks.3"),
]


def _step(make: Callable[[], nn.Module], on: bool) -> tuple[list[torch.Tensor], dict, int]:
    """Gradients and state after one forward and backward from seed 0, and the bytes of
    the tensors autograd kept outside any recomputed block."""
    torch.manual_seed(0)
    model = make().train()
    assert attach(model) is not None
    assert set_recompute(model, on) and recomputing(model) == on
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)
    kept = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros(()) for p in model.parameters()]
    return grads, {k: v.clone() for k, v in model.state_dict().items()}, kept


@pytest.mark.parametrize(("name", "make", "found"), ZOO, ids=[z[0] for z in ZOO])
def test_a_zoo_model_recomputes_its_blocks_with_the_same_gradients_and_buffers(
    name: str, make: Callable[[], nn.Module], found: str
) -> None:
    """BatchNorm's running statistics are updated once, dropout draws the same mask, the
    parameter names stay, and less than half the activations are kept."""
    model = make()
    names = list(model.state_dict())
    got = attach(model)
    assert got is not None and got.text() == found
    assert list(model.state_dict()) == names
    plain, plain_state, plain_kept = _step(make, False)
    again, state, kept = _step(make, True)
    for a, b in zip(plain, again, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert state.keys() == plain_state.keys()
    for key, value in plain_state.items():
        assert torch.equal(state[key], value), key
    assert any("running_mean" in k for k in state) == (name == "resnet18")
    assert kept < plain_kept / 2, (kept, plain_kept)


def test_a_block_runs_again_in_backward_only_while_its_switch_is_on() -> None:
    model = _resnet()
    attach(model)
    x = torch.randn(2, 3, 32, 32)
    counts: list[int] = []

    def count(m: nn.Module, args: object) -> None:
        counts.append(1)

    # A pre-hook: the recomputation stops once it has what backward needs (early_stop),
    # before the block's forward hooks.
    model.layer1[0].register_forward_pre_hook(count)
    model(x).sum().backward()
    assert len(counts) == 1
    set_recompute(model, True)
    counts.clear()
    model(x).sum().backward()
    assert len(counts) == 2  # the forward and its recomputation in backward
    counts.clear()
    with torch.no_grad():
        model(x)
    assert len(counts) == 1


class _Block(nn.Module):
    def __init__(self, inner: type[nn.Module] = nn.Sequential) -> None:
        super().__init__()
        self.mix = inner(nn.Linear(4, 4), nn.Tanh()) if inner is nn.Sequential else inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(x)


class _Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(h(x) for h in self.heads)  # type: ignore[return-value]


def test_the_finder_takes_the_class_with_most_blocks_and_never_bare_layers() -> None:
    two = nn.Sequential(_Block(), _Block())
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(*[_Block() for _ in range(3)]), two)
    assert [n for n, _ in repeated_blocks(model)] == ["1.0", "1.1", "1.2", "2.0", "2.1"]
    # Parts of every block (three heads in each of two blocks) are not the trunk.
    heads = nn.ModuleList([_Block(), _Block(), _Block()])
    trunk = nn.Sequential(
        *[nn.Sequential(copy.deepcopy(heads), nn.Linear(4, 64)) for _ in range(2)]
    )
    assert [n for n, _ in repeated_blocks(trunk)] == ["0", "1"]
    # A run of bare layers, or of mixed classes, is no block.
    assert repeated_blocks(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))) == []
    assert repeated_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))) == []
    assert attach(nn.Sequential(nn.Linear(4, 4), nn.ReLU())) is None


def test_no_recomputed_block_contains_an_fsdp_unit() -> None:
    """shard_units shards each ModuleList element: a block holding one is not recomputed
    when sharded (its recomputation would gather that unit again), and is when not."""
    model = nn.Sequential(_Block(_Heads), _Block(_Heads))
    assert len(repeated_blocks(model)) == 2
    assert repeated_blocks(model, shard_units(model)) == []
    # A ViT's blocks lie inside its one unit `blocks` (a Sequential, not a ModuleList).
    vit = _vit()
    assert len(repeated_blocks(vit, shard_units(vit))) == 4


# ---- through ctx.wrap and the memory probe --------------------------------------------------


def test_wrap_on_recomputes_a_zoo_model_and_refuses_one_without_blocks() -> None:
    ctx = init("equal", device="cpu", activation_checkpointing="on")
    try:
        model = ctx.wrap(_resnet())
        assert recomputing(model) and len(switches(model)) == 8
        assert ctx.recompute.blocks == "8 BasicBlock: layer1.0 … layer4.1"
        assert ctx.recompute.as_dict()["blocks"] == ctx.recompute.blocks
        with pytest.raises(ConfigError) as err:
            ctx.wrap(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)))
        assert (
            "no activation_checkpointing switch and no repeated blocks: an nn.ModuleList "
            "or nn.Sequential of two or more modules of one class" in str(err.value)
        )
        assert "\n" not in str(err.value)
        plain = ctx.wrap(_resnet(), activation_checkpointing="off")
        assert switches(plain) == []  # off: the model is left untouched
    finally:
        ctx.close()


def test_auto_says_when_a_model_has_no_repeated_blocks() -> None:
    ctx = init("equal", device="cpu")
    try:
        ctx.wrap(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)))
        assert ctx.recompute.text() == (
            "off on every rank (auto: the model has no switch and no repeated blocks)"
        )
    finally:
        ctx.close()


def test_probe_memory_turns_a_zoo_models_recomputation_on_where_memory_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Alone with a global batch of 7: 2 MB a sample leave 3 samples under 9 MB, 0.5 MB a
    sample recomputing leave 14: auto turns the ResNet's blocks on, and the cap is 14."""
    monkeypatch.setenv(INJECT_ENV, "0:1e7:2e6:2e6:5e5")
    ctx = init("equal", device="cpu", min_batch=2)
    model = ctx.wrap(_resnet())
    assert not recomputing(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(
        torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)
    )
    ctx.loader(data, 7, seed=1)
    try:
        loss = nn.functional.cross_entropy
        assert ctx.probe_memory(model, opt, lambda b: loss(model(b[0]), b[1])) == (14,)
        assert recomputing(model) and ctx.recompute.ranks == (True,)
        assert ctx.recompute.reasons[0].startswith("on: memory holds 3 of the 7 samples")
        assert ctx.recompute.blocks.startswith("8 BasicBlock")
    finally:
        ctx.close()


def test_a_command_jobs_script_takes_its_global_batch_from_the_job_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ctx.loader(dataset)`` in a job a coordinator launched uses the job file's global
    batch; asking for another fails at once, naming both (``ctx.job`` holds the terms)."""
    terms = '{"global_batch":6,"name":"mine","policy":"equal","rebalance_interval":5,"steps":3}'
    monkeypatch.setenv("HETERO_JOB", terms)
    data = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
    with pytest.raises(ConfigError, match=r"ht\.init: policy='dynamic', but job 'mine' says"):
        init("dynamic", device="cpu")
    ctx = init(device="cpu")
    try:
        assert ctx.job is not None and ctx.job.steps == 3 and ctx.config.policy == "equal"
        assert ctx.config.rebalance_interval == 5
        with pytest.raises(
            ConfigError, match=r"global_batch=8, but job 'mine' says global_batch: 6"
        ):
            ctx.loader(data, 8)
        assert len(next(iter(ctx.loader(data)))[0]) == 6
    finally:
        ctx.close()
