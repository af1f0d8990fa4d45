"""The transformer models and their losses: published sizes, training, exactness per sample."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from hetero.trainer.datasets.text import SyntheticText
from hetero.trainer.models import MODELS, build_model
from hetero.trainer.models.transformer import CONFIGS, build_transformer
from hetero.trainer.tasks import evaluate, make_task


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Small models run faster on one thread than fighting for a shared machine's cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name,params", [("gpt2-small", 124_439_808), ("bert-base", 109_512_762)])
def test_published_configs_have_the_published_sizes(name: str, params: int):
    with torch.device("meta"):
        model = build_transformer(name)
    assert sum(p.numel() for p in model.parameters()) == params
    assert MODELS[name].task == ("causal-lm" if CONFIGS[name].causal else "masked-lm")


def _data(name: str, seq_len: int = 32):
    model = build_model(name)
    task = make_task(MODELS[name].task)
    raw = SyntheticText(2048, seq_len, task.data_vocab(model), seed=1)
    return model, task, task.prepare(raw, model, seed=1)


@pytest.mark.parametrize("name,steps,drop", [("gpt2-tiny", 200, 2.0), ("bert-tiny", 300, 0.3)])
def test_tiny_model_trains_and_its_loss_falls(one_thread, name: str, steps: int, drop: float):
    torch.manual_seed(0)
    model, task, data = _data(name)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cpu = torch.device("cpu")
    losses = []
    for step in range(steps):
        x, y = data.get_batch(list(range(step * 16 % 2000, step * 16 % 2000 + 16)), cpu)
        loss = task.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < first - drop, (first, last)
    result = evaluate(model, data, task, cpu, samples=64, batch=32)
    assert result["eval_loss"] < first and 0.0 <= result["eval_accuracy"] <= 1.0


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny"])
def test_batch_loss_is_the_mean_of_per_sample_losses(name: str):
    """What makes b_i/B weighting exact: the loss decomposes over samples."""
    torch.manual_seed(0)
    model, task, data = _data(name, seq_len=16)
    x, y = data.get_batch(list(range(7)), torch.device("cpu"))
    with torch.no_grad():
        out = model(x)
        whole = task.loss(out, y)
        parts = torch.stack([task.loss(out[i : i + 1], y[i : i + 1]) for i in range(7)])
    assert whole.item() == pytest.approx(parts.mean().item(), rel=1e-6)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model, task, data = _data("gpt2-tiny", seq_len=16)
    x, y = data.get_batch(list(range(4)), torch.device("cpu"))
    grads = []
    for checkpointing in (False, True):
        model.activation_checkpointing = checkpointing
        model.zero_grad()
        task.loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
