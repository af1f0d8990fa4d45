"""Activation checkpointing for a model of one's own: its repeated blocks, recomputed
without a change to the model.

A model with no ``activation_checkpointing`` switch (``hetero.trainer.models.recompute``)
— a timm ViT, a torchvision ResNet, a Hugging Face transformer, a user's own — is
searched for its repeated blocks, and each block found gets PyTorch's composable
activation checkpointing (``torch.distributed._composable.checkpoint``,
non-reentrant), switched off until ``activation_checkpointing`` or the memory probe
turns it on (``recompute.set_recompute``).

**Which blocks.** A *run* is an ``nn.ModuleList`` or ``nn.Sequential`` of two or
more children of one class, each with submodules and parameters of its own (a run
of bare ``nn.Linear`` layers is no block: a lone layer keeps its input for backward
whether recomputed or not). The children of every run are grouped by class; of the
classes whose blocks hold at least half the parameters that the most-holding class's
do (the model's trunk, not a part of every block such as its attention heads), the
one with the most blocks wins (ties: more parameters, then the first found), so a
Swin's blocks win over the stages that hold them: a timm ViT's ``blocks`` (12
``Block``), a torchvision ResNet's four ``layerN`` (``BasicBlock`` or
``Bottleneck``, all of them), a GPT-2's ``h``. A block nested in another block of
the winning class is left to its parent.

**Why composable checkpointing and not ``apply_activation_checkpointing``.** The
latter (``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``) replaces each
block with a ``CheckpointWrapper``: every parameter's name gains a
``_checkpoint_wrapped_module.`` part, and the wrapping cannot be undone. The memory
probe turns recomputation on for one rank and off again when it does not pay, after
the model is wrapped and its optimizer built, and the ranks' parameter names must
agree (sharded checkpoints are keyed by them). The composable API registers forward
hooks instead, keeps the model's structure and names, and runs only while its
``enable_hook`` is set: that flag is the switch.

**The invariants the built-in switch keeps.** Gradients are those of a step without
recomputation (the recomputed forward replays the RNG state, so dropout draws the
same mask). BatchNorm's running statistics are updated once a step: the
recomputation runs inside :class:`~hetero.trainer.models.recompute.KeepBuffers`,
which puts the block's buffers back as the forward left them. Under FSDP2 a
recomputed block must issue no collective of its own (``recompute``'s module doc
says why): a block found here is never one that strictly contains an FSDP unit
(:func:`hetero.trainer.sharding.shard_units` chooses those; this finder is not that
rule, which shards the elements of an ``nn.ModuleList``, else the root's children),
so it is a unit itself or lies inside one, and its unit's pre-backward hook has
gathered its parameters before it runs again (FSDP2's forward hooks skip a unit in
``PRE_BACKWARD``, torch 2.14.1).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from torch import nn
from torch.distributed._composable.checkpoint_activation import checkpoint

from hetero.trainer.models.recompute import KeepBuffers

#: What the finder looks for, in words (for the summary and errors).
LOOKED_FOR = (
    "repeated blocks: an nn.ModuleList or nn.Sequential of two or more modules of one "
    "class with layers and parameters of their own"
)


@dataclass(frozen=True)
class Found:
    """The blocks chosen: their class and their names in the model, in module order."""

    kind: str
    names: tuple[str, ...]

    def text(self) -> str:
        """E.g. ``12 Block: blocks.0 … blocks.11``."""
        span = self.names[0] if len(self.names) == 1 else f"{self.names[0]} … {self.names[-1]}"
        return f"{len(self.names)} {self.kind}: {span}"


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _block(module: nn.Module) -> bool:
    return any(True for _ in module.children()) and _params(module) > 0


def repeated_blocks(
    model: nn.Module, units: Iterable[nn.Module] = ()
) -> list[tuple[str, nn.Module]]:
    """``model``'s repeated blocks (named, in module order; empty when none), chosen as
    the module doc says; none strictly contains a module of ``units`` (the FSDP units
    ``model`` will be sharded into, if it will be)."""
    unit_ids = {id(u) for u in units}
    by_class: dict[type[nn.Module], list[tuple[str, nn.Module]]] = {}
    for name, run in model.named_modules():
        if not isinstance(run, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(run.named_children())
        kinds = {type(c) for _, c in children}
        if len(children) < 2 or len(kinds) != 1 or not all(_block(c) for _, c in children):
            continue
        for child_name, child in children:
            full = f"{name}.{child_name}" if name else child_name
            if any(id(m) in unit_ids for m in child.modules() if m is not child):
                continue  # its recomputation would gather a unit inside it (module doc)
            by_class.setdefault(type(child), []).append((full, child))
    if not by_class:
        return []
    order = list(by_class)
    held = {k: sum(_params(m) for _, m in by_class[k]) for k in order}
    trunk = [k for k in order if 2 * held[k] >= max(held.values())]
    best = max(trunk, key=lambda k: (len(by_class[k]), held[k], -order.index(k)))
    chosen = by_class[best]
    inner = {id(m) for _, b in chosen for m in b.modules() if m is not b}
    return [(n, b) for n, b in chosen if id(b) not in inner]


def attach(model: nn.Module, units: Iterable[nn.Module] = ()) -> Found | None:
    """Give each of ``model``'s repeated blocks composable checkpointing, switched off;
    the blocks found, or ``None`` when there are none (then ``model`` is untouched).
    ``units`` as :func:`repeated_blocks`."""
    blocks = repeated_blocks(model, units)
    if not blocks:
        return None
    for _, block in blocks:

        def contexts(
            block: nn.Module = block,
        ) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
            return nullcontext(), KeepBuffers(block)

        checkpoint(block, context_fn=contexts)
        checkpoint.state(block).enable_hook = False  # until set_recompute turns it on
    return Found(type(blocks[0][1]).__name__, tuple(n for n, _ in blocks))
