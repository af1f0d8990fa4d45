"""How the built-in job turns a batch into a loss: classification, causal LM, masked LM.

The exact-gradient contract (docs/trainer.md) needs each rank's loss to be
the **mean over its samples** of a per-sample loss that does not depend on the
other samples of the batch: then ``ctx.backward`` weights rank *i* by
``b_i/B`` and the summed gradient is that of the mean over all *B* samples.

- classification: cross-entropy of each sample's logits; mean over samples.
- causal LM: each sample's loss is its mean next-token cross-entropy over its
  ``T`` positions. Every sample has the same ``T``, so the mean over the
  rank's ``b_i·T`` tokens *is* the mean over samples of per-sample means.
- masked LM: each sample's loss is its mean cross-entropy over its *hidden*
  positions (the number differs between samples; every sample has at least
  one). The rank's loss is the mean of those per-sample means. The global
  objective is therefore "mean over the B samples of each sample's mean
  masked-token loss", which is independent of how the batch is cut. (The
  usual "mean over all masked tokens of the batch" would weight a sample by
  its share of the batch's masked tokens, which depends on the other samples:
  not decomposable over ranks without an extra all-reduce of counts.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import Dataset

from hetero.core.errors import ConfigError
from hetero.trainer.datasets.text import (
    IGNORE_INDEX,
    CausalLMSamples,
    MaskedLMSamples,
    _Windows,
)


@dataclass(frozen=True)
class Task:
    """Classification: ``(N, C)`` logits against ``(N,)`` labels."""

    name: str = "classification"
    text: bool = False  # needs token windows rather than images

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """This rank's loss: the mean over its samples (see the module doc)."""
        return F.cross_entropy(output, target)

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Correct predictions and how many were scored (samples or tokens)."""
        return (output.argmax(-1) == target).sum(), int(target.numel())

    def prepare(self, dataset: Dataset[Any], model: Any, *, seed: int) -> Dataset[Any]:
        """The dataset as ``(input, target)`` pairs for this task."""
        if isinstance(dataset, _Windows):
            raise ConfigError(
                "an image model needs an image dataset (synthetic, imagefolder, cifar10, cifar100)"
            )
        return dataset

    def data_vocab(self, model: Any) -> int:
        """Token ids synthetic data may use (language models only)."""
        raise ConfigError("an image model has no vocabulary")


@dataclass(frozen=True)
class CausalLM(Task):
    """``(N, T, V)`` logits against the next tokens ``(N, T)``."""

    name: str = "causal-lm"
    text: bool = True

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Equal T per sample: the token mean is the mean of per-sample means.
        return F.cross_entropy(output.flatten(0, 1), target.flatten())

    def _windows(self, dataset: Dataset[Any]) -> _Windows:
        if not isinstance(dataset, _Windows):
            raise ConfigError(f"a {self.name} model needs a text dataset (synthetic-text, text)")
        return dataset

    def prepare(self, dataset: Dataset[Any], model: Any, *, seed: int) -> Dataset[Any]:
        windows = self._windows(dataset)
        if windows.vocab_size > model.config.vocab_size:
            raise ConfigError(
                f"data uses {windows.vocab_size} token ids, the model only "
                f"{model.config.vocab_size}"
            )
        return CausalLMSamples(windows)

    def data_vocab(self, model: Any) -> int:
        return int(model.config.vocab_size)


@dataclass(frozen=True)
class MaskedLM(CausalLM):
    """``(N, T, V)`` logits against the original tokens at hidden positions (-100 elsewhere)."""

    name: str = "masked-lm"

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        n, t = target.shape
        per_token = F.cross_entropy(
            output.flatten(0, 1), target.flatten(), reduction="none", ignore_index=IGNORE_INDEX
        ).view(n, t)
        hidden = (target != IGNORE_INDEX).sum(1).clamp_min(1)
        return (per_token.sum(1) / hidden).mean()

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
        scored = target != IGNORE_INDEX
        return ((output.argmax(-1) == target) & scored).sum(), int(scored.sum().item())

    def prepare(self, dataset: Dataset[Any], model: Any, *, seed: int) -> Dataset[Any]:
        cfg = model.config
        return MaskedLMSamples(
            self._windows(dataset),
            mask_token_id=cfg.mask_token_id,
            vocab_size=cfg.vocab_size,
            seed=seed,
        )

    def data_vocab(self, model: Any) -> int:
        return int(model.config.mask_token_id)  # every id below [MASK]


TASKS: dict[str, Task] = {t.name: t for t in (Task(), CausalLM(), MaskedLM())}


def make_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(f"unknown task {name!r} (known: {', '.join(TASKS)})") from None


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    dataset: Dataset[Any],
    task: Task,
    device: torch.device,
    *,
    samples: int,
    batch: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """Mean loss and accuracy of ``model`` over the first ``samples`` samples of ``dataset``;
    ``progress(done, total)`` after each batch, if given.

    Run on one rank with the unwrapped model (no collectives). The loss is the
    task's per-sample mean, averaged over samples; accuracy is per sample for
    classification and per scored token for the language models.
    """
    was_training = model.training
    model.eval()
    n = min(samples, len(dataset))  # type: ignore[arg-type]
    loss_sum, correct, scored = 0.0, 0, 0
    get_batch = getattr(dataset, "get_batch", None)
    try:
        for start in range(0, n, batch):
            idx = list(range(start, min(start + batch, n)))
            if get_batch is not None:
                x, y = get_batch(idx, device)
            else:
                x, y = torch.utils.data.default_collate([dataset[i] for i in idx])
                x, y = x.to(device), y.to(device)
            out = model(x)
            loss_sum += float(task.loss(out.float(), y).item()) * len(idx)
            c, s = task.correct(out, y)
            correct += int(c.item())
            scored += s
            if progress is not None:
                progress(idx[-1] + 1, n)
    finally:
        model.train(was_training)
    return {
        "eval_samples": float(n),
        "eval_loss": loss_sum / n if n else float("nan"),
        "eval_accuracy": correct / scored if scored else float("nan"),
    }
