"""What the partitioner needs of a model and of each rank's device, measured.

:func:`profile` measures, once and on one device, each part of a model at the microbatch
size: the head (what runs before the first block), each kind of block (alike blocks once:
class, parameter shapes and input shape), the tail (what runs after the last block, the
loss included). Forward and backward seconds (the least of a few runs after a warm-up:
contention only adds), the training state its parameters hold (parameter, gradient and
AdamW's two moments: 16 bytes a parameter, as :mod:`hetero.core.memfit` counts it), and
the bytes autograd saves for backward (summed over ``saved_tensors_hooks``: a device-free
count, the same on CPU and GPU). The blocks are those
:func:`hetero.trainer.models.repeated.repeated_blocks` finds.

A built-in language model says what its head and tail are (``head_parts``, ``embedded``;
``tail_parts``, ``logits``), so each is run alone. Any other model is measured through
its own forward: the head is that forward stopped at the first block's input (a pre-hook
that raises), each kind of block is run alone on the input it gets in the model, and the
tail is the whole model's forward, loss and backward less the head and the blocks. The
state of its parameters counts in the head if a module holding them runs before the first
block, else in the tail.

:func:`speed_probe` is what a rank's device does against the profiling device: the
seconds of one block's forward and backward at the microbatch size, on each rank, run
back to back as a stage runs them (a shared GPU's share shows only then); each rank's
speed is the profiling rank's seconds over its own.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from hetero.core.stages import Model, PartCost
from hetero.trainer.models.repeated import repeated_blocks
from hetero.trainer.models.transformer import GPT, BertMLM
from hetero.trainer.pipeline.stage import Loss, is_builtin, lm_loss

#: Training state a parameter holds under fp32 AdamW: parameter, gradient, two moments.
STATE_BYTES_PER_PARAM = 16


def _state_bytes(params: Sequence[torch.Tensor]) -> float:
    return float(sum(p.numel() for p in params) * STATE_BYTES_PER_PARAM)


def _storages(model: nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def _measure(
    run: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    samples: int,
    repeats: int,
    params: set[int],
) -> PartCost:
    """Forward and backward of ``run`` on ``x`` (a leaf): the least seconds, and the bytes
    autograd saved in forward per sample. A storage saved twice counts once, and the
    parameters' storages (``params``: their data pointers) not at all: they are state."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    times = []
    for i in range(repeats + 1):  # the first run warms allocators and kernels up
        saved.clear()
        x = x.detach().requires_grad_(x.is_floating_point())
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run(x)
        out.backward(torch.ones_like(out))
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        if i:
            times.append(time.perf_counter() - start)
    # The least time: contention from other work only ever adds to a run.
    return PartCost(min(times), 0.0, sum(saved.values()) / samples)


def _kind(block: nn.Module, x: torch.Tensor) -> tuple[object, ...]:
    """Blocks of one class, parameter shapes and input shape cost the same: each such kind
    is measured once, so the timing noise of one run cannot tell alike blocks apart (and a
    split of alike blocks over alike devices stays even)."""
    return (type(block), tuple(p.shape for p in block.parameters()), x.shape, x.dtype)


def _blocks(
    blocks: Sequence[nn.Module], inputs: Sequence[torch.Tensor], repeats: int, params: set[int]
) -> list[PartCost]:
    measured: dict[tuple[object, ...], PartCost] = {}
    out = []
    for block, x in zip(blocks, inputs, strict=True):
        kind = _kind(block, x)
        if kind not in measured:
            cost = _measure(block, x, x.shape[0], repeats, params)
            state = _state_bytes(list(block.parameters()))
            measured[kind] = PartCost(cost.seconds, state, cost.activation_bytes)
        out.append(measured[kind])
    return out


def profile(
    model: nn.Module,
    sample: torch.Tensor,
    target: torch.Tensor,
    *,
    loss: Loss = lm_loss,
    repeats: int = 5,
) -> Model:
    """Each part of ``model`` (head, blocks, tail with ``loss``) measured at ``sample``'s
    batch (a microbatch of input, on the device to profile on), as the module doc says.
    The model's gradients are left set; zero them before training."""
    if is_builtin(model):
        return _profile_builtin(model, sample, target, loss, repeats)  # type: ignore[arg-type]
    return _profile_traced(model, sample, target, loss, repeats)


def _profile_builtin(
    model: GPT | BertMLM, sample: torch.Tensor, target: torch.Tensor, loss: Loss, repeats: int
) -> Model:
    n = sample.shape[0]
    with torch.no_grad():
        inputs = [model.embedded(sample)]
        for block in model.blocks:
            inputs.append(block(inputs[-1]))

    def state(names: Sequence[str]) -> float:
        # A part's attribute is a module or a bare parameter (BERT's head_bias). A weight
        # both ends share counts on both: each of the two stages holds its copy.
        parts = [getattr(model, k) for k in names]
        return sum(
            _state_bytes(list(p.parameters())) if isinstance(p, nn.Module) else _state_bytes([p])
            for p in parts
        )

    params = _storages(model)
    head = _measure(model.embedded, sample, n, repeats, params)
    blocks = _blocks(list(model.blocks), inputs[:-1], repeats, params)
    tail = _measure(lambda h: loss(model.logits(h), target), inputs[-1], n, repeats, params)
    return Model(
        tuple(blocks),
        head=PartCost(head.seconds, state(model.head_parts), head.activation_bytes),
        tail=PartCost(tail.seconds, state(model.tail_parts), tail.activation_bytes),
    )


class _Reached(Exception):
    """Raised at the first block's input: the head is done."""

    def __init__(self, x: torch.Tensor) -> None:
        super().__init__()
        self.x = x


def _profile_traced(
    model: nn.Module, sample: torch.Tensor, target: torch.Tensor, loss: Loss, repeats: int
) -> Model:
    n = sample.shape[0]
    found = repeated_blocks(model)
    blocks = [b for _, b in found]
    inputs: list[torch.Tensor] = []
    ran: set[int] = set()  # the modules that ran before the first block: the head's
    in_head = [True]

    def keep_input(module: nn.Module, args: Any) -> None:
        inputs.append(args[0].detach())
        in_head[0] = False

    def note(module: nn.Module, args: Any) -> None:
        if in_head[0]:
            ran.add(id(module))

    hooks = [b.register_forward_pre_hook(keep_input) for b in blocks]
    hooks += [m.register_forward_pre_hook(note) for m in model.modules()]
    with torch.no_grad():
        model(sample)
    for h in hooks:
        h.remove()

    def head(x: torch.Tensor) -> torch.Tensor:
        def stop(module: nn.Module, args: Any) -> None:
            raise _Reached(args[0])

        hook = blocks[0].register_forward_pre_hook(stop)
        try:
            model(x)
        except _Reached as reached:
            return reached.x
        finally:
            hook.remove()
        raise RuntimeError("the model's forward never reached its first block")

    params = _storages(model)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    head_params: dict[int, torch.Tensor] = {}
    tail_params: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            if id(p) not in in_blocks:
                (head_params if id(m) in ran else tail_params)[id(p)] = p
    first = _measure(head, sample, n, repeats, params)
    costs = _blocks(blocks, inputs, repeats, params)
    whole = _measure(lambda x: loss(model(x), target), sample, n, repeats, params)
    # The tail is what the whole model costs beyond its head and blocks (never below 0).
    rest = whole.seconds - first.seconds - sum(c.seconds for c in costs)
    saved = whole.activation_bytes - first.activation_bytes
    saved -= sum(c.activation_bytes for c in costs)
    return Model(
        tuple(costs),
        head=PartCost(
            first.seconds, _state_bytes(list(head_params.values())), first.activation_bytes
        ),
        tail=PartCost(max(rest, 0.0), _state_bytes(list(tail_params.values())), max(saved, 0.0)),
    )


def speed_probe(
    model: nn.Module,
    sample: torch.Tensor,
    device: torch.device,
    *,
    window_s: float = 0.2,
    windows: int = 3,
) -> float:
    """Seconds of the forward and backward of ``model``'s first block on ``device``, at
    ``sample``'s microbatch, as a stage runs it: back to back for ``window_s`` (at least 3
    runs) with one synchronisation at the end, the median of ``windows`` windows. The
    block is copied to the device and the model left as it was.

    Sustained, not the least of single runs: a GPU shared with another process is
    time-sliced between the two, and a run that waits for its result before the next
    waits out the other's slice each time. Single runs of GPT-2 large's block on an
    NVIDIA H200 shared with a matmul neighbour gave 0.33 of the idle GPU's speed; its
    stages, streaming kernels, ran at 0.43; the predicted stage times were 29-37% long."""
    import copy

    found = repeated_blocks(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no repeated blocks")
    inputs: list[torch.Tensor] = []

    def keep(module: nn.Module, args: Any) -> None:
        raise _Reached(args[0])

    hook = found[0][1].register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            model(sample)
    except _Reached as reached:
        inputs.append(reached.x)
    finally:
        hook.remove()
    if not inputs:
        raise RuntimeError("the model's forward never reached its first block")
    block = copy.deepcopy(found[0][1]).to(device)
    x = inputs[0].to(device).detach().requires_grad_(inputs[0].is_floating_point())
    once = _measure(block, x, x.shape[0], 1, set()).seconds  # warms up, sizes the window
    runs = max(3, math.ceil(window_s / max(once, 1e-6)))
    seconds = []
    for _ in range(windows):
        _sync(device)
        start = time.perf_counter()
        for _ in range(runs):
            out = block(x)
            out.backward(torch.ones_like(out))
        _sync(device)
        seconds.append((time.perf_counter() - start) / runs)
    return statistics.median(seconds)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
