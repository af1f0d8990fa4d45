"""Activation checkpointing inside the built-in models: a switch and the blocks it recomputes.

A model that can checkpoint has a bool attribute ``activation_checkpointing``
(default ``False``) that its ``forward`` honours by running each of its natural
blocks through :func:`run_block`: a ResNet's residual blocks, a CNN's conv
blocks, a transformer's layers. With the switch on (in training, with autograd
recording) a block keeps only its input for backward and runs its forward again
there (``torch.utils.checkpoint``, non-reentrant), so a step holds one block's
activations at a time instead of every block's; with it off the block runs as
usual. The switch can be flipped on one rank alone and at any time: it changes
neither the parameters, their names nor the gradients (to float rounding), and a
flip needs no collective.

**Why the blocks sit where they do.** Under FSDP2 each unit's parameters are
gathered by a forward pre-hook; a unit's pre-backward hook gathers them again
and marks the unit as in backward, and its forward hooks then skip gathering
(torch 2.14.1, ``FSDPState._pre_forward``). A recomputed block therefore issues
no collective only when it is a unit itself or lies inside one, so that its
recomputation runs after its unit's pre-backward hook: a rank that recomputes
and one that does not then run the same collectives in the same order. The
blocks here are chosen that way against ``hetero.trainer.sharding.shard_units``
(a ResNet's stem, whose conv and BatchNorm are separate units, is not
recomputed).

**BatchNorm.** Recomputing a block in training mode runs its BatchNorm layers a
second time, which would update their running statistics twice.
:class:`KeepBuffers` restores the block's buffers after the recomputation, so a
checkpointed step leaves them as an ordinary step does.

A model of one's own opts in the same way: a bool ``activation_checkpointing``
attribute and its blocks through :func:`run_block`. One that does not gets its
repeated blocks recomputed through PyTorch's composable checkpointing
(``hetero.trainer.models.repeated``), whose per-module ``enable_hook`` flag is a
switch too: the functions below set and read both kinds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.distributed._composable.checkpoint_activation import checkpoint as composable
from torch.distributed._composable.contract import _get_registry
from torch.utils.checkpoint import checkpoint

#: The attribute a model's switch lives in.
SWITCH = "activation_checkpointing"


class KeepBuffers:
    """Context manager: the buffers of ``module`` (BatchNorm's running statistics and
    step count) as they were on entry, restored on exit. Used around a recomputation."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> None:
        self.saved = [(b, b.detach().clone()) for b in self.module.buffers()]

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with torch.no_grad():
            for buffer, value in self.saved:
                buffer.copy_(value)
        self.saved = []


def run_block(
    owner: nn.Module, call: Callable[[torch.Tensor], Any], x: torch.Tensor, keep: nn.Module
) -> Any:
    """``call(x)``, checkpointed when ``owner``'s switch is on, ``owner`` is training and
    autograd records: the activations inside ``call`` are recomputed in backward instead
    of kept, and the buffers of ``keep`` (the module ``call`` runs) are left as one
    forward leaves them."""
    if not (getattr(owner, SWITCH, False) and owner.training and torch.is_grad_enabled()):
        return call(x)
    return checkpoint(
        call, x, use_reentrant=False, context_fn=lambda: (nullcontext(), KeepBuffers(keep))
    )


class Blocks(nn.Sequential):
    """An ``nn.Sequential`` whose runs of layers are recomputed in backward when its
    switch is on: the layers before ``ends[0]`` are one block, those up to ``ends[1]``
    the next, and so on (default: each layer its own block). The parameters keep the
    names they have in a plain ``Sequential`` of the same layers."""

    def __init__(self, *layers: nn.Module, ends: tuple[int, ...] | None = None) -> None:
        super().__init__(*layers)
        self.activation_checkpointing = False
        self.ends = ends if ends is not None else tuple(range(1, len(layers) + 1))
        if not self.ends or self.ends[-1] != len(layers) or list(self.ends) != sorted(self.ends):
            raise ValueError(f"block ends {self.ends} do not cover {len(layers)} layers")

    def _run(self, start: int, end: int, x: torch.Tensor) -> torch.Tensor:
        for i in range(start, end):
            x = self[i](x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = 0
        for end in self.ends:
            x = run_block(self, functools.partial(self._run, start, end), x, self)
            start = end
        return x


def _composable(module: nn.Module) -> bool:
    """Whether ``module`` carries PyTorch's composable checkpointing (``repeated``'s or the
    user's own). Read from its registry: ``composable.state`` would write into every
    module it is asked about."""
    return "checkpoint" in (_get_registry(module) or {})


def switches(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` (wrapped in DDP or sharded by FSDP2 or not) that carry a
    checkpointing switch: a bool ``activation_checkpointing`` attribute, or composable
    checkpointing."""
    return [
        m for m in model.modules() if isinstance(getattr(m, SWITCH, None), bool) or _composable(m)
    ]


def _is_on(module: nn.Module) -> bool:
    if _composable(module):
        return bool(composable.state(module).enable_hook)
    return bool(getattr(module, SWITCH))


def set_recompute(model: nn.Module, on: bool) -> bool:
    """Turn ``model``'s checkpointing on or off; whether it has a switch at all."""
    found = switches(model)
    for m in found:
        if _composable(m):
            composable.state(m).enable_hook = on
        else:
            setattr(m, SWITCH, on)
    return bool(found)


def recomputing(model: nn.Module) -> bool:
    """Whether ``model`` checkpoints its activations now."""
    return any(_is_on(m) for m in switches(model))
