"""A model's repeated blocks as pipeline stages sized to unlike devices.

Three parts, each usable alone:

- :func:`profile` measures, once and on one device, each part of a built-in language
  model at the microbatch size: the head (embeddings), each kind of block (alike blocks
  once), the tail (output layer and loss). Forward and backward seconds (the least of a
  few runs after a warm-up: contention only adds), the training state its parameters
  hold (parameter, gradient and AdamW's two moments: 16 bytes a parameter, as
  :mod:`hetero.core.memfit` counts it), and the bytes
  autograd saves for backward (summed over ``saved_tensors_hooks``: a device-free count,
  so the same on CPU and GPU). The blocks are those :func:`hetero.trainer.models.repeated.
  repeated_blocks` finds, which for the built-in models are ``model.blocks``.
- :func:`hetero.core.stages.partition` (pure) cuts the blocks where the devices' speeds
  and memory say.
- :func:`build` keeps, on one rank, its stage of the model alone and returns a
  :class:`Pipe`: the stage, its ``torch.distributed.pipelining`` schedule (1F1B by
  default, GPipe on request) and :meth:`Pipe.step`, which runs one global batch.

**Exactness.** A step gives one process's gradient over the same global batch: the
schedule cuts the batch into ``microbatches`` equal microbatches, each stage's loss is a
microbatch's mean, and the schedule divides the gradients by ``microbatches``
(``scale_grads``), so they are the global mean's. The output layer shares ``tok_emb``'s
weight with the embedding (GPT-2, BERT): the first and the last stage each hold a copy,
and after each step's backward the two copies' gradients are summed between those two
ranks (Megatron-LM's treatment of tied embeddings), so both take the same update and
stay equal. Dropout draws differ from one process's, as they do under data parallelism.

**Scope.** One pipeline over the whole group (``world_size`` stages, one a rank, in rank
order); pipeline replicas under the data-parallel planner are not built yet. The built-in
transformers (``head_parts`` / ``tail_parts`` say what runs before and after the blocks,
``embedded`` / ``logits`` run it); a user's model would need the same four.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from hetero.core.stages import Model, PartCost, Schedule
from hetero.trainer.emulation import emulate_wait
from hetero.trainer.models.transformer import GPT, BertMLM

#: Training state a parameter holds under fp32 AdamW: parameter, gradient, two moments.
STATE_BYTES_PER_PARAM = 16

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``(N, T, V)`` logits against ``(N, T)`` ids (-100 ignored)."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)


class StageClock:
    """A stage's own compute, forward and backward, in seconds (the waits for its
    neighbours left out), and the emulated slowdown: after each forward and each
    backward it waits ``(slowdown − 1)`` times that pass's compute
    (``hetero.trainer.emulation.emulate_wait``), counted in the total."""

    def __init__(self, slowdown: float = 1.0) -> None:
        self.slowdown = slowdown
        self.seconds = 0.0
        self.passes = 0
        self._backward_from = 0.0

    def forward_done(self, started: float) -> None:
        compute = time.perf_counter() - started
        self.seconds += compute + emulate_wait(self.slowdown, compute)

    def backward_starts(self) -> None:
        self._backward_from = time.perf_counter()

    def backward_done(self) -> None:
        compute = time.perf_counter() - self._backward_from
        self.seconds += compute + emulate_wait(self.slowdown, compute)
        self.passes += 1


class _Mark(torch.autograd.Function):
    """Identity; its backward tells ``clock`` that the stage's backward starts (at the
    stage's output) or is done (at its input)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: StageClock, done: bool) -> torch.Tensor:
        ctx.clock, ctx.done = clock, done
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.done:
            ctx.clock.backward_done()
        else:
            ctx.clock.backward_starts()
        return grad, None, None


class Stage(nn.Module):
    """Blocks ``start:stop`` of ``model``, with its head on the first stage and its tail
    on the last. Parameters keep the whole model's names (``blocks.7.fc.weight``), so a
    stage's state dict is a slice of the model's. ``clock`` times it (outside it: the
    first stage's embedding backward and the last stage's loss)."""

    def __init__(self, model: GPT | BertMLM, start: int, stop: int, *, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.clock = StageClock()
        keep = set((model.head_parts if first else ()) + (model.tail_parts if last else ()))
        blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(start, stop)})
        for name in {*model.head_parts, *model.tail_parts} - keep:
            delattr(model, name)
        model.blocks = blocks  # type: ignore[assignment]  # a ModuleDict keeps the indices
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        started = time.perf_counter()
        if self.first:
            x = m.embedded(x)
        timed = torch.is_grad_enabled() and x.requires_grad
        if timed:
            x = _Mark.apply(x, self.clock, True)
        for block in m.blocks.values():  # type: ignore[operator]
            x = block(x)
        x = m.logits(x) if self.last else x
        if timed:
            x = _Mark.apply(x, self.clock, False)
        self.clock.forward_done(started)
        return x


@dataclass
class Pipe:
    """One rank's stage and schedule. ``tied``: the names of parameters that another
    stage holds a copy of, and ``tied_group`` the ranks that hold them."""

    stage: Stage
    schedule: ScheduleGPipe | Schedule1F1B
    stages: int
    index: int
    tied: tuple[str, ...]
    tied_group: dist.ProcessGroup | None

    def step(self, x: torch.Tensor, target: torch.Tensor) -> float | None:
        """Forward and backward of one global batch (every rank passes the same ``x`` and
        ``target``; each uses what its stage needs). The gradients are then one process's
        over the batch; the caller steps its optimizer. The batch's mean loss on the
        last stage, ``None`` on the others."""
        losses: list[torch.Tensor] = []
        if self.index == 0 and self.index == self.stages - 1:
            self.schedule.step(x, target=target, losses=losses)
        elif self.index == 0:
            self.schedule.step(x)
        elif self.index == self.stages - 1:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        self._sum_tied()
        if not losses:
            return None
        return float(torch.stack([loss.detach() for loss in losses]).mean())

    def _sum_tied(self) -> None:
        if self.tied_group is None:
            return
        params = dict(self.stage.named_parameters())
        for name in self.tied:
            grad = params[name].grad
            assert grad is not None, f"{name} got no gradient"
            dist.all_reduce(grad, group=self.tied_group)


def build(
    model: GPT | BertMLM,
    bounds: Sequence[int],
    microbatches: int,
    *,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    loss: Loss = lm_loss,
    device: torch.device | None = None,
) -> Pipe:
    """This rank's stage of ``model``: blocks ``bounds[rank]:bounds[rank + 1]`` (``bounds``
    from :func:`hetero.core.stages.partition`, one stage a rank of the default group), its
    schedule over ``microbatches`` microbatches, and the tied weights' group. Every rank
    calls it (the tied group is made collectively). ``model`` is cut in place."""
    rank, stages = dist.get_rank(), dist.get_world_size()
    if len(bounds) != stages + 1:
        raise ValueError(f"{len(bounds) - 1} stages for {stages} ranks")
    device = device or torch.device("cpu")
    stage = Stage(model, bounds[rank], bounds[rank + 1], first=rank == 0, last=rank == stages - 1)
    stage.to(device)
    tied_names = tuple(f"model.{n}.weight" for n in set(model.head_parts) & set(model.tail_parts))
    made = dist.new_group([0, stages - 1]) if stages > 1 and tied_names else None
    # A rank outside the new group gets a marker, not a group: it holds no tied copy.
    group = made if isinstance(made, dist.ProcessGroup) else None
    held = dict(stage.named_parameters())
    tied = tuple(n for n in tied_names if n in held) if group is not None else ()
    pipe_stage = PipelineStage(stage, rank, stages, device)
    kind = ScheduleGPipe if schedule is Schedule.GPIPE else Schedule1F1B
    return Pipe(
        stage,
        kind(pipe_stage, microbatches, loss_fn=loss),
        stages,
        rank,
        tied,
        group if tied else None,
    )


# ---- profiling ------------------------------------------------------------------------------


def _state_bytes(module: nn.Module) -> float:
    return float(sum(p.numel() for p in module.parameters()) * STATE_BYTES_PER_PARAM)


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


def profile(
    model: GPT | BertMLM, sample: torch.Tensor, target: torch.Tensor, *, repeats: int = 5
) -> Model:
    """Each part of ``model`` (head, blocks, tail with the loss) measured at ``sample``'s
    batch (a microbatch of token ids, ``(N, T)``, on the device to profile on), as the
    module doc says. The model's gradients are left set; zero them before training."""
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
            _state_bytes(p) if isinstance(p, nn.Module) else p.numel() * STATE_BYTES_PER_PARAM
            for p in parts
        )

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    head = _measure(model.embedded, sample, n, repeats, params)
    blocks = []
    measured: dict[tuple[object, ...], PartCost] = {}
    for block, x in zip(model.blocks, inputs, strict=False):
        # Blocks of one class, parameter shapes and input shape cost the same: each such
        # kind is measured once, so the timing noise of one run cannot tell alike blocks
        # apart (and a split of alike blocks over alike devices stays even).
        kind = (type(block), tuple(p.shape for p in block.parameters()), x.shape, x.dtype)
        if kind not in measured:
            cost = _measure(block, x, n, repeats, params)
            measured[kind] = PartCost(cost.seconds, _state_bytes(block), cost.activation_bytes)
        blocks.append(measured[kind])
    tail = _measure(lambda h: lm_loss(model.logits(h), target), inputs[-1], n, repeats, params)
    return Model(
        tuple(blocks),
        head=PartCost(head.seconds, state(model.head_parts), head.activation_bytes),
        tail=PartCost(tail.seconds, state(model.tail_parts), tail.activation_bytes),
    )


# ---- moving stages: a checkpoint keyed by the whole model's names ---------------------------


def stage_state(pipe: Pipe, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """This rank's share of a pipeline checkpoint: ``{"params": name -> tensor, "optim":
    name -> that parameter's optimizer state}``, names the whole model's (no ``model.``
    prefix). The union over the ranks is the whole model's state whatever the split, so
    it loads onto any other split (:func:`load_stage_state`)."""
    named = dict(pipe.stage.named_parameters())
    params = {k.removeprefix("model."): v.detach().clone() for k, v in named.items()}
    optim = {
        k.removeprefix("model."): {s: v.clone() if torch.is_tensor(v) else v for s, v in st.items()}
        for k, p in named.items()
        if (st := optimizer.state.get(p))
    }
    return {"params": params, "optim": optim}


def load_stage_state(
    pipe: Pipe, optimizer: torch.optim.Optimizer, shares: Sequence[dict[str, dict[str, Any]]]
) -> None:
    """Load this rank's stage, parameters and optimizer state, from the shares of every
    rank of a pipeline of any split (:func:`stage_state`); a tied weight's copies are
    equal, so either serves."""
    params: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, Any]] = {}
    for share in shares:
        params.update(share["params"])
        optim.update(share["optim"])
    with torch.no_grad():
        for name, p in pipe.stage.named_parameters():
            p.copy_(params[name.removeprefix("model.")])
            if (st := optim.get(name.removeprefix("model."))) is not None:
                optimizer.state[p] = {
                    s: v.clone().to(p.device) if torch.is_tensor(v) else v for s, v in st.items()
                }
