"""``ctx.wrap(model, pipeline=N)``: a training loop's model cut into stages sized to its
ranks, in replicas that the data-parallel planner gives uneven shares of each batch.

::

    ctx = ht.init()
    model = ctx.wrap(model, pipeline=2)          # this rank's stage
    optimizer = torch.optim.AdamW(model.parameters())
    loader = ctx.loader(dataset, global_batch=512)  # this rank's replica's share
    for x, y in loader:
        loss = model.step(x, y)                  # forward and backward, in microbatches
        optimizer.step(); optimizer.zero_grad()
        ctx.step(loss)                            # the loss on a replica's last stage, else None

**How the split is chosen.** Rank 0 profiles the model's parts on its device at the
microbatch size (``profile``); every rank times one block on its own device at once
(``speed_probe``), so each device's speed over rank 0's is measured under the load it
trains under, and an emulated slowdown divides it. Each stage is cut for its replicas'
devices (``hetero.core.pipeplan.stage_devices``) and the split is
:func:`hetero.core.stages.partition`'s; rank 0 decides and every rank gets its bounds.

**Defaults a user need not touch.** A microbatch of :data:`MICROBATCH` samples (fewer when
the global batch asks: ``microbatch_for`` takes the largest divisor of the global batch at
most that): small enough that a stage of a large model holds its in-flight activations,
large enough that a GPU's kernels stay busy; the step then has ``B / μ`` microbatches,
shared among the replicas. The schedule is 1F1B: the same bubble as GPipe, ``(S − 1)``
stage slots a step, but a stage holds at most ``S − index`` microbatches' activations,
not all of them. The loss is the language models' cross-entropy (``lm_loss``: any
``(..., C)`` logits against ids); pass ``loss_fn`` otherwise.

**A replica's pace.** A stage's step time is its replica's (the stages wait on each
other), so each rank reports its own, and the planner counts a replica as fast as its
slowest stage (``replica_intervals``), planning in microbatches (``MicrobatchPlanner``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hetero.core.errors import ConfigError
from hetero.core.pipeplan import Layout, microbatch_for, stage_devices
from hetero.core.stages import Model, Partition, Pipeline, Schedule, partition, stage_cost
from hetero.trainer.models.recompute import set_recompute
from hetero.trainer.pipeline.pipe import Pipe, build
from hetero.trainer.pipeline.profile import profile, speed_probe
from hetero.trainer.pipeline.stage import Loss, is_builtin, lm_loss

if TYPE_CHECKING:
    from hetero.trainer.context import Context

#: Samples a microbatch unless the loop says otherwise (module doc).
MICROBATCH = 4
#: Bytes a CPU stage may use, for the partitioner: host memory is not what binds a CPU run.
CPU_CAPACITY = float(2**50)


@dataclass(frozen=True)
class Split:
    """How a model was cut: the profile, each stage's device as cut for, the split with
    its predicted stage seconds a microbatch, and the microbatch (samples)."""

    model: Model
    speeds: tuple[float, ...]
    capacities: tuple[float, ...]
    partition: Partition
    microbatch: int


class PipelineModel(nn.Module):
    """What ``ctx.wrap(model, pipeline=N)`` returns on a rank: its stage (``stage``; build
    the optimizer from this module's parameters) and :meth:`step`. It is not called: a
    pipeline's forward and backward interleave, microbatch by microbatch."""

    def __init__(
        self, ctx: Context, pipe: Pipe, split: Split, example: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.stage = pipe.module
        self.pipe = pipe
        self.split = split
        #: A microbatch of input the model was traced with (a model of one's own).
        self.example = example
        self._ctx = ctx

    def describe(self) -> str:
        """``pipeline 2 stages x 1 replica(s), blocks (20, 16), microbatch 4``."""
        layout = self.pipe.layout
        return (
            f"pipeline {layout.stages} stages x {layout.replicas} replica(s), blocks "
            f"{self.split.partition.sizes}, microbatch {self.pipe.microbatch}"
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            "a pipeline stage is not called: loss = model.step(x, y) runs forward and backward"
        )

    def step(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of this replica's share of the step (``ctx.loader``'s batch:
        every stage of a replica draws the same), timed for the planner; the share's mean
        loss on the replica's last stage, None elsewhere. Step the optimizer after it."""
        ctx, pipe = self._ctx, self.pipe
        sizes = ctx._step_sizes
        if not sizes:
            raise ConfigError("model.step(x, y) before a batch was drawn from ctx.loader()")
        pipe.clock.slowdown = ctx.slowdown_at(ctx.global_step)
        injected = pipe.clock.injected
        ctx.clock.mark("fwd_begin")
        loss = pipe.forward_backward(x, target, sum(sizes))
        ctx.clock.injected_s += pipe.clock.injected - injected
        ctx.clock.mark("grads_ready")
        pipe.sum_replicas()
        ctx.clock.mark("bwd_end")
        return loss


def wrap_pipeline(
    ctx: Context,
    model: nn.Module,
    stages: int,
    *,
    microbatch: int | None = None,
    schedule: str = "1f1b",
    loss_fn: Loss | None = None,
    example: tuple[torch.Tensor, torch.Tensor] | None = None,
    split: Sequence[int] | None = None,
) -> PipelineModel:
    """What :meth:`Context.wrap` does with ``pipeline=stages`` (module doc). ``example``:
    a batch of input and target (any number of samples; needed for a model of one's
    own), ``split``: bounds to use instead of the partitioner's (a resumed split)."""
    if ctx._loader is not None:
        raise ConfigError("call ctx.wrap(model, pipeline=N) before ctx.loader(): it plans replicas")
    if ctx.config.shard != "none":
        raise ConfigError("pipeline stages do not combine with shard: the stages split the layers")
    layout = Layout(stages, ctx.world_size)
    wanted = microbatch or MICROBATCH
    job_batch = ctx.job.global_batch if ctx.job is not None else None
    mu = microbatch_for(job_batch, layout.replicas, wanted) if job_batch else wanted
    x, y = _example(model, example, mu)
    chosen = _choose(ctx, model, layout, x, y, loss_fn or lm_loss, Schedule(schedule), split)
    if ctx.config.activation_checkpointing == "on" and is_builtin(model):
        set_recompute(model, True)  # its blocks run through the model's switch (``Stage``)
    traced = x[: chosen.microbatch].to(ctx.device) if not is_builtin(model) else None
    pipe = build(
        model,
        chosen.partition.bounds,
        chosen.microbatch,
        layout=layout,
        schedule=Schedule(schedule),
        loss=loss_fn or lm_loss,
        device=ctx.device,
        example=traced,
    )
    wrapped = PipelineModel(ctx, pipe, chosen, traced)
    ctx.pipeline = wrapped
    ctx.layout = layout
    return wrapped


def _example(
    model: nn.Module, example: tuple[torch.Tensor, torch.Tensor] | None, samples: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A microbatch of ``samples`` to profile and trace with: from ``example``, repeated
    if it is shorter; a built-in language model's is random token ids."""
    if example is None:
        config = getattr(model, "config", None)
        if not is_builtin(model) or config is None:
            raise ConfigError(
                f"ctx.wrap(pipeline=N) of {type(model).__name__} needs example=(x, y), a batch "
                "of its input and target, to measure and trace it"
            )
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, config.vocab_size - 1, (samples, config.seq_len + 1), generator=g)
        return ids[:, :-1], ids[:, 1:]
    x, y = example
    times = math.ceil(samples / x.shape[0])
    return torch.cat([x] * times)[:samples], torch.cat([y] * times)[:samples]


def _choose(
    ctx: Context,
    model: nn.Module,
    layout: Layout,
    x: torch.Tensor,
    y: torch.Tensor,
    loss: Loss,
    schedule: Schedule,
    split: Sequence[int] | None,
) -> Split:
    """Every rank: the split rank 0 chose (module doc), with what it was chosen from."""
    mu = x.shape[0]
    probe = speed_probe(model, x, ctx.device)
    factor = ctx.slowdown_at(ctx.global_step)
    mine = [probe * factor, _capacity(ctx.device)]
    every: list[Any] = [mine]
    if ctx.world_size > 1:
        every = [None] * ctx.world_size
        dist.all_gather_object(every, mine)
    speeds = tuple(every[0][0] / s for s, _ in every)
    capacities = tuple(float(c) for _, c in every)
    chosen: list[Any] = [None]
    if ctx.rank == 0:
        on = model.to(ctx.device)
        costs = profile(on, x.to(ctx.device), y.to(ctx.device), loss=loss)
        model.to("cpu")
        model.zero_grad(set_to_none=True)
        devices = stage_devices(speeds, capacities, layout)
        cfg = Pipeline(4 * layout.stages, mu, schedule)
        if split is None:
            cut = partition(costs, devices, cfg)
        else:  # a given split (a resumed one): what the model predicts of it
            bounds = tuple(split)
            seconds = [
                stage_cost(costs, devices, cfg, j, bounds[j], bounds[j + 1])
                for j in range(layout.stages)
            ]
            cut = Partition(bounds, tuple(s for s, _ in seconds), tuple(p for _, p in seconds))
        chosen = [Split(costs, speeds, capacities, cut, mu)]
    if ctx.world_size > 1:
        dist.broadcast_object_list(chosen, src=0)
    assert isinstance(chosen[0], Split)
    return chosen[0]


def _capacity(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return CPU_CAPACITY


def pipeline_figures(ctx: Context) -> dict[str, Any]:
    """The pipeline's figures for a run's summary (collective: every rank's stage clock is
    gathered): its layout, the split and the speeds it was cut for, and each stage's
    predicted and measured seconds a microbatch (measured: the mean over its replicas of
    its own compute since the last call, emulated waits included)."""
    assert ctx.pipeline is not None and ctx.layout is not None
    layout, split = ctx.layout, ctx.pipeline.split
    seconds, _, passes = ctx.pipeline.pipe.clock.take()
    mine = [seconds, passes]
    every: list[Any] = [mine]
    if ctx.world_size > 1:
        every = [None] * ctx.world_size
        dist.all_gather_object(every, mine)
    measured = []
    for j in range(layout.stages):
        timed = [every[r] for r in layout.stage_ranks(j) if every[r][1] > 0]
        measured.append(sum(s / n for s, n in timed) / len(timed) if timed else None)
    return {
        "stages": layout.stages,
        "replicas": layout.replicas,
        "microbatch": ctx.pipeline.pipe.microbatch,
        "schedule": ctx.pipeline.pipe.schedule.value,
        "bounds": list(split.partition.bounds),
        "blocks": list(split.partition.sizes),
        "speeds": list(split.speeds),
        "predicted_stage_s": list(split.partition.stage_seconds),
        "measured_stage_s": measured,
    }


def recut(ctx: Context, model: nn.Module, bounds: Sequence[int]) -> PipelineModel:
    """Every rank: a fresh copy of the model (``model``) cut at ``bounds`` in place of the
    pipeline ``ctx`` runs, with its layout, microbatch, schedule, loss and groups; its
    parameters are the fresh model's until a checkpoint is loaded into them. The split's
    predicted stage times are the profile's for the speeds last cut for."""
    old = ctx.pipeline
    assert old is not None and ctx.layout is not None
    p = old.pipe
    costs, devices = (
        old.split.model,
        stage_devices(old.split.speeds, old.split.capacities, ctx.layout),
    )
    cfg = Pipeline(4 * ctx.layout.stages, p.microbatch, p.schedule)
    bounds = tuple(bounds)
    seconds = [
        stage_cost(costs, devices, cfg, j, bounds[j], bounds[j + 1]) for j in range(len(devices))
    ]
    cut = Partition(bounds, tuple(s for s, _ in seconds), tuple(b for _, b in seconds))
    example = old.example
    pipe = build(
        model,
        bounds,
        p.microbatch,
        layout=ctx.layout,
        schedule=p.schedule,
        loss=p.loss or lm_loss,
        device=ctx.device,
        example=example,
        groups=p.groups,
    )
    wrapped = PipelineModel(ctx, pipe, replace(old.split, partition=cut), example)
    ctx.pipeline = wrapped
    return wrapped
