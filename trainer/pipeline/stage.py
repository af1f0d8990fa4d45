"""One rank's stage of a model: its blocks, with the head on the first stage and the tail
on the last, and the clock that times its own compute.

Two ways to cut a model into stages, one module each way:

- :class:`Stage` cuts the built-in language models (GPT-2, BERT), which say what runs
  before their blocks and after them (``head_parts``, ``tail_parts``) and how
  (``embedded``, ``logits``). It keeps the model object and deletes what the stage does
  not hold, so parameter names are the whole model's under ``model.``.
- :func:`traced_stage` cuts any other model at its repeated blocks
  (:func:`hetero.trainer.models.repeated.repeated_blocks`) with torch's tracer front end,
  ``torch.distributed.pipelining.pipeline`` (``torch.export`` of the model, split before
  the first block of each stage): whatever runs between the input and the first block,
  or after the last, goes with the first or the last stage, however the model's forward
  is written, as long as it exports. Parameter names are the whole model's.

**The clock** (:class:`StageClock`, attached by hooks, so a stage's names do not change)
counts a stage's own compute, forward and backward of every microbatch, not its waits
for its neighbours: forward from the stage module's call to its return; backward from
the moment the gradient reaches the stage's output to the end of that microbatch's
backward pass (a callback the autograd engine runs when the pass ends: the first stage's
embedding backward is in it, the last stage's loss backward is not). On CUDA the marks
are events, read at :meth:`StageClock.take`, since host time at a hook is when kernels
were queued. An emulated slowdown ``f`` waits ``(f − 1)`` times each pass's compute after
it (``hetero.trainer.emulation``), counted in the total and apart in ``injected``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hetero.core.errors import ConfigError
from hetero.trainer.emulation import emulate_wait
from hetero.trainer.models.recompute import run_block
from hetero.trainer.models.transformer import GPT, BertMLM

#: A loss: ``(output, target) -> mean loss`` over the output's samples.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``(..., C)`` logits against the ids of the same leading shape
    (-100 ignored): a language model's ``(N, T, V)`` and a classifier's ``(N, C)`` alike."""
    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=-100)


class StageClock:
    """A stage's own compute in seconds and its passes (module doc). ``slowdown`` is the
    emulated factor in force (1: none)."""

    def __init__(self, device: torch.device, slowdown: float = 1.0) -> None:
        self.cuda = device.type == "cuda"
        self.slowdown = slowdown
        self._host = 0.0
        self.injected = 0.0
        self.passes = 0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._forward_from: tuple[float, torch.cuda.Event | None] = (0.0, None)
        self._backward_from: tuple[float, torch.cuda.Event | None] = (0.0, None)

    def attach(self, module: nn.Module) -> None:
        """Time ``module``'s forward and backward from now on."""
        module.register_forward_pre_hook(self._forward_begins)
        module.register_forward_hook(self._forward_ends)

    def _mark(self) -> tuple[float, torch.cuda.Event | None]:
        if not self.cuda:
            return time.perf_counter(), None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return time.perf_counter(), event

    def _close(self, began: tuple[float, torch.cuda.Event | None]) -> None:
        ended = self._mark()
        if self.cuda:
            assert began[1] is not None and ended[1] is not None
            self._events.append((began[1], ended[1]))
            if self.slowdown > 1.0:  # the wait needs the pass's real compute
                ended[1].synchronize()
                compute = began[1].elapsed_time(ended[1]) / 1e3
                self.injected += emulate_wait(self.slowdown, compute)
            return
        compute = ended[0] - began[0]
        self._host += compute
        self.injected += emulate_wait(self.slowdown, compute)

    def _forward_begins(self, module: nn.Module, args: Any) -> None:
        self._forward_from = self._mark()

    def _forward_ends(self, module: nn.Module, args: Any, output: Any) -> Any:
        self._close(self._forward_from)
        self.passes += 1
        if torch.is_tensor(output) and output.requires_grad:
            return _Mark.apply(output, self)
        return output

    def backward_begins(self) -> None:
        self._backward_from = self._mark()
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_ends)

    def _backward_ends(self) -> None:
        self._close(self._backward_from)

    @property
    def seconds(self) -> float:
        """The compute timed so far, emulated waits included (s); on CUDA this waits for
        the last pass's kernels."""
        if self._events:
            self._events[-1][1].synchronize()
            self._host += sum(a.elapsed_time(b) for a, b in self._events) / 1e3
            self._events.clear()
        return self._host + self.injected

    def take(self) -> tuple[float, float, int]:
        """The seconds, the emulated seconds among them and the microbatches timed since
        the last call; counting starts again."""
        out = (self.seconds, self.injected, self.passes)
        self._host = self.injected = 0.0
        self.passes = 0
        return out


class _Mark(torch.autograd.Function):
    """Identity on a stage's output; its backward is where the stage's backward begins."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: StageClock) -> torch.Tensor:
        ctx.clock = clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.backward_begins()
        return grad, None


@dataclass(frozen=True)
class Cut:
    """A rank's stage: its ``module``; for each tied weight it holds, its name there and
    the stages holding a copy (``ties``); and every such set of stages in the model
    (``tie_sets``, the same on every rank: their groups are made collectively)."""

    module: nn.Module
    ties: dict[str, tuple[int, ...]]
    tie_sets: frozenset[tuple[int, ...]]


def cut_builtin(model: GPT | BertMLM, bounds: Sequence[int], stage: int) -> Cut:
    """Stage ``stage`` of a built-in model split at ``bounds`` (cut in place): the weight
    both its head and its tail use (the token embedding) is held by the first and the
    last stage."""
    stages = len(bounds) - 1
    shared = sorted(set(model.head_parts) & set(model.tail_parts))
    names = [
        f"model.{part}.{n}" for part in shared for n, _ in getattr(model, part).named_parameters()
    ]
    module = Stage(
        model, bounds[stage], bounds[stage + 1], first=stage == 0, last=stage == stages - 1
    )
    if stages == 1 or not names:
        return Cut(module, {}, frozenset())
    ends = (0, stages - 1)
    held = dict(module.named_parameters())
    return Cut(module, {n: ends for n in names if n in held}, frozenset({ends}))


class Stage(nn.Module):
    """Blocks ``start:stop`` of a built-in language model, with its head on the first
    stage and its tail on the last. Parameters keep the whole model's names
    (``model.blocks.7.fc.weight``), so a stage's state dict is a slice of the model's.
    A block runs through ``run_block``: the model's recomputation switch applies."""

    def __init__(self, model: GPT | BertMLM, start: int, stop: int, *, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        keep = set((model.head_parts if first else ()) + (model.tail_parts if last else ()))
        blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(start, stop)})
        for name in {*model.head_parts, *model.tail_parts} - keep:
            delattr(model, name)
        model.blocks = blocks  # type: ignore[assignment]  # a ModuleDict keeps the indices
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        if self.first:
            x = m.embedded(x)
        for block in m.blocks.values():  # type: ignore[operator]
            x = run_block(m, block, x, block)
        return m.logits(x) if self.last else x


def is_builtin(model: nn.Module) -> bool:
    """Whether ``model`` says how to cut it (the built-in language models)."""
    return isinstance(model, GPT | BertMLM)


def aliases(model: nn.Module) -> list[tuple[str, ...]]:
    """The names of each parameter ``model`` holds under more than one (a tied weight)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [tuple(n) for n in names.values() if len(n) > 1]


def traced_stage(
    model: nn.Module,
    block_names: Sequence[str],
    bounds: Sequence[int],
    stage: int,
    example: torch.Tensor,
) -> Cut:
    """Stage ``stage`` of ``model`` cut before the blocks ``block_names[bounds[1:-1]]`` by
    torch's tracer (module doc), ``example`` a microbatch of the model's input.

    The tracer gives a stage every name of a tied weight any of its modules is reached
    by, as separate parameters, used or not; they are made one parameter again here, so
    a stage's copy is one tensor whose gradient the copies' sum completes (``pipe``).
    Every rank traces the whole model and keeps its stage alone."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    tied = aliases(model)
    cuts = {block_names[b]: SplitPoint.BEGINNING for b in bounds[1:-1]}
    try:
        traced = pipeline(model, mb_args=(example,), split_spec=cuts)
    except Exception as exc:  # export's failures are long and many: name the first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot cut {type(model).__name__} into pipeline stages: torch.export could not "
            f"trace it ({first[:200]})"
        ) from None
    modules = [traced.get_stage_module(j) for j in range(traced.num_stages)]
    held = [dict(m.named_parameters(remove_duplicate=False)) for m in modules]
    ties: dict[str, tuple[int, ...]] = {}
    sets: set[tuple[int, ...]] = set()
    for names in tied:
        holders = tuple(j for j, h in enumerate(held) if any(n in h for n in names))
        if len(holders) > 1:
            sets.add(holders)
        present = [n for n in names if n in held[stage]]
        if not present:
            continue
        one = held[stage][present[0]]
        for n in present[1:]:
            owner, _, leaf = n.rpartition(".")
            setattr(modules[stage].get_submodule(owner), leaf, one)
        if len(holders) > 1:
            ties[present[0]] = holders
    return Cut(modules[stage], ties, frozenset(sets))
