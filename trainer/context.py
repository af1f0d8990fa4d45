"""The trainer API a training loop adopts: ``init``, ``wrap``, ``loader``, ``backward``, ``step``.

::

    ctx = ht.init(policy="dynamic")
    model = ctx.wrap(model)
    loader = ctx.loader(dataset, global_batch=512)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        ctx.backward(loss)
        optimizer.step(); optimizer.zero_grad()
        ctx.step()

``init`` joins the torch.distributed job described by the environment (torchrun,
``hetero-train``, or an agent) or runs alone. ``wrap`` puts the model in DDP with the
exact-weighting comm hook and the timing hooks, or with ``pipeline=N`` cuts it into
pipeline stages (``trainer.pipeline``): a plan's entries are then the pipeline's
replicas (``dp_rank``, ``dp_size``), not the ranks. ``loader`` yields this rank's share of each
global batch, of a map-style dataset or of a stream. ``step`` closes the step and, at each
rebalance boundary, exchanges statistics and applies the next plan on every rank at the
same step. Over the usual ~450 lines: it is the API's one object, and each of
its methods already hands its work to a module of its own (``loading``, ``rebalance``,
``bootstrap``, ``intervalhooks``).

``Context`` is the facade over the parts: ``bootstrap`` (config, device, backend, process
group), ``timing`` (step phases, hooks), ``gradients`` and ``commsched`` (the comm hook and
when its all-reduces start), ``loading`` (the first plan and the loader: ``HeteroLoader``,
``StreamLoader``), ``rebalance`` (the protocol at each boundary), ``metrics`` (one record
per interval) and ``intervalhooks`` (the interval's figures for the user's loggers).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from hetero.core import replan
from hetero.core.balancer import DeviceProfile, Interval
from hetero.core.catalogue import BY_NAME
from hetero.core.errors import ConfigError
from hetero.core.gap import Solo
from hetero.core.pipeplan import Layout
from hetero.core.rankenv import JobTerms, RankEnv, term
from hetero.trainer import procgroup
from hetero.trainer.activations import RecomputeChoice
from hetero.trainer.bootstrap import (
    TrainerConfig,
    default_backend,
    emulated_slowdowns,
    every_ranks_slowdowns,
    join_process_group,
    pick_device,
)
from hetero.trainer.commsched import CommRecord, comm_policy
from hetero.trainer.drain import StopRequest
from hetero.trainer.emulation import Slowdown
from hetero.trainer.exchange import EmbeddedPlanner, Planner, RankSummary
from hetero.trainer.gpustats import open_sampler
from hetero.trainer.gradients import WeightingState
from hetero.trainer.intervalhooks import IntervalCallback, IntervalHooks
from hetero.trainer.loader import HeteroLoader
from hetero.trainer.loading import Loader, open_loader
from hetero.trainer.metrics import MetricsWriter
from hetero.trainer.progress import ProgressFile
from hetero.trainer.rebalance import IntervalTotals, PlanRecord, rebalance, recheck
from hetero.trainer.streamloader import StreamLoader
from hetero.trainer.tensorboard import TensorBoardWriter, require_tensorboard
from hetero.trainer.timing import PhaseHooks, StepClock, StepTimes

if TYPE_CHECKING:
    from hetero.trainer.pipeline.wrap import PipelineModel

__all__ = ["Context", "HeteroLoader", "PlanRecord", "StreamLoader", "TrainerConfig"]


class Context:
    """One training process's view of a hetero job. Create it with :func:`init`."""

    def __init__(self, config: TrainerConfig, *, profiles: Sequence[DeviceProfile] | None = None):
        self.config = config
        self.env = env = RankEnv.from_env()
        self.rank, self.world_size, self.local_rank = env.rank, env.world_size, env.local_rank
        self.device = pick_device(config.device, env)
        self.slowdowns = emulated_slowdowns(config, env, self.device)
        self.emulated = bool(self.slowdowns)
        if profiles is not None and len(profiles) != self.world_size:
            raise ConfigError(f"{len(profiles)} device profiles for {self.world_size} ranks")
        self.profiles = profiles
        self.backend = config.backend or default_backend(self.device, env)
        if self.backend == "nccl" and self.device.type != "cuda":
            raise ConfigError(f"rank {self.rank} has no GPU but the job's backend is NCCL")
        if config.tensorboard is not None:
            require_tensorboard()  # on every rank: none may join a group rank 0 leaves
        join_process_group(
            self.backend, self.rank, self.world_size, self.device, config.collective_timeout_s
        )
        self.slowdowns = every_ranks_slowdowns(self.slowdowns)
        self.emulated = bool(self.slowdowns)
        self.progress = ProgressFile(env.progress_file)
        self.progress.beat()
        self.clock = StepClock(self.device)
        self.hooks = PhaseHooks(self.clock, lambda: self.slowdown_at(self.global_step))
        self.weighting = WeightingState(on_grads_ready=self.hooks.grads_ready)
        self.comm_choice = config.comm
        self.comm = comm_policy(config.comm)
        #: Every change of comm mode, from the one set at ``wrap`` on.
        self.comm_changes: list[CommRecord] = []
        #: The comm mode each interval ran (None without DDP), as ``summaries``.
        self.interval_comm: list[str | None] = []
        self.metrics = MetricsWriter(config.output_dir, self.rank)
        #: The user's loggers, called at each boundary (``on_interval``).
        self.interval_hooks = IntervalHooks(self.rank)
        #: This rank's GPU utilisation and memory per interval (None: CPU rank or no NVML).
        self.gpu = open_sampler(self.device)
        self.history: collections.deque[Interval] = collections.deque(
            maxlen=config.history_intervals
        )
        self.plans: list[PlanRecord] = []
        #: Rank 0: why balancing does not beat equal batches here, as the planner last
        #: said it ("" while it helps or cannot tell; ``Decision.not_helping``).
        self.not_helping = ""
        self.summaries: list[list[RankSummary]] = []
        self.interval_walls: list[float] = []
        self.global_step = 0
        #: Steps the job will run, if known: a plan change must pay before the end (``payback``).
        self.total_steps: int | None = None
        self.stats_from_step = config.warmup_steps
        self.planner: Planner | None = None
        self.max_batch: tuple[int | None, ...] | None = config.max_batch
        self._loader: Loader | None = None
        self._ddp = False
        #: ``grad_op`` or ``full`` once :meth:`wrap` sharded the model with FSDP2.
        self.shard = "none"
        #: The model :meth:`wrap` cut into pipeline stages, and its ranks' layout (None:
        #: data parallel alone). The plans are then the replicas' (``dp_rank``).
        self.pipeline: PipelineModel | None = None
        self.layout: Layout | None = None
        #: Which ranks recompute activations in backward, and why (``trainer.activations``).
        self.recompute = RecomputeChoice(
            config.activation_checkpointing,
            (False,) * env.world_size,
            ("not wrapped yet",) * env.world_size,
        )
        self._step_sizes: tuple[int, ...] = ()
        self._last_batch = -1
        self._batch_since = 0  # global step from which this rank ran its current batch size
        self._batch_switched = False  # whether that size replaced another (a plan change)
        self._last_loss: torch.Tensor | None = None
        self._interval = IntervalTotals()
        #: When to re-check a move within the interval, and the steps it resolved (``recheck``).
        self._recheck_at: int | None = None
        self._early_times: list[StepTimes] = []
        #: Each rank alone at its batch (``measure_ideal``), for the ideal and the gap breakdown.
        self.solo: list[Solo] | None = None
        #: Rank 0: one record per :meth:`evaluate` (``step``, ``metrics``), oldest first.
        self.evals: list[dict[str, Any]] = []
        self._stop: StopRequest | None = None
        self._board: TensorBoardWriter | None = None
        if config.tensorboard is not None and self.rank == 0:
            self._board = TensorBoardWriter(config.tensorboard, self.evals)
            self.on_interval(self._board)

    # -- properties -------------------------------------------------------------------
    @property
    def plan(self) -> tuple[int, ...]:
        """The latest plan scheduled (it may apply a few steps from now)."""
        return self._require_loader().sampler.schedule.plans[-1]

    @property
    def comm_mode(self) -> str | None:
        """When the gradient all-reduces start this step (None without DDP)."""
        return self.weighting.mode if self._ddp else None

    @property
    def running_plan(self) -> tuple[int, ...]:
        """The plan of the last step run (``plan`` may be scheduled for a later step)."""
        return self._step_sizes or self.plan

    @property
    def stopping(self) -> bool:
        """All ranks agreed to stop after this step (:meth:`stop_on_sigterm`)."""
        return self._stop is not None and self._stop.agreed

    @property
    def dp_rank(self) -> int:
        """This rank's entry in a plan: its rank, or its pipeline replica."""
        return self.rank if self.layout is None else self.layout.replica_of(self.rank)

    @property
    def dp_size(self) -> int:
        """Entries in a plan: the ranks, or the pipeline replicas."""
        return self.world_size if self.layout is None else self.layout.replicas

    @property
    def slowdown(self) -> Slowdown | None:
        return self.slowdowns.get(self.rank)

    def slowdown_at(self, step: int) -> float:
        s = self.slowdown
        return s.factor_at(step) if s else 1.0

    # -- model ------------------------------------------------------------------------
    def wrap(
        self,
        model: nn.Module,
        *,
        sync_batchnorm: bool = False,
        comm: str | None = None,
        shard: str | bool | None = None,
        offload: str | None = None,
        param_dtype: torch.dtype | None = None,
        activation_checkpointing: str | bool | None = None,
        pipeline: int | None = None,
        microbatch: int | None = None,
        schedule: str = "1f1b",
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        example: tuple[torch.Tensor, torch.Tensor] | None = None,
        split: Sequence[int] | None = None,
        **ddp_kwargs: Any,
    ) -> nn.Module:
        """Move ``model`` to this rank's device and wrap it for uneven-batch data parallelism.

        BatchNorm statistics are computed over each rank's own batch (as in
        plain DDP, where they come from B/W samples); pass ``sync_batchnorm=True``
        to compute them over the whole global batch instead. ``comm`` (``auto``,
        ``overlap``, ``deferred``; default: ``init``'s) says when the gradient
        all-reduces start; give the same on every rank.

        ``shard`` (``none``, ``grad_op``, ``full``, or ``True`` for ``full``;
        default: ``init``'s) shards parameters, gradients and optimizer state with
        FSDP2 instead of replicating them in DDP; ``offload="params"`` keeps the
        shards in host memory; ``param_dtype`` gathers and computes in that dtype
        (``trainer.sharding``). ``activation_checkpointing`` (``auto``, ``on``, ``off``;
        default: ``init``'s) sets the model's recomputation switch (a model without one
        gets its repeated blocks one, ``trainer.models.repeated``); ``auto`` lets
        :meth:`probe_memory` turn it on for a rank whose memory binds
        (``trainer.activations``). Build the optimizer from the returned model.

        ``pipeline`` (default: ``init``'s, 1) > 1 cuts the model into that many stages, one
        a rank, sized to each rank's measured speed and memory; the ranks make replicas of
        the pipeline, which the plans give uneven shares of each global batch. Call it
        before :meth:`loader`; the returned module is this rank's stage: train it with
        ``loss = model.step(x, y)`` in place of forward and :meth:`backward`.
        ``microbatch`` (samples, default 4), ``schedule`` (``1f1b`` or ``gpipe``) and
        ``loss_fn`` (default: cross-entropy of logits against ids) need no touching;
        ``example=(x, y)``, a batch, is needed for a model other than the built-in
        language models; ``split`` (the blocks' bounds, ``(0, b1, ..., n)``) cuts there
        instead of where the measured speeds say (``hetero.trainer.pipeline.wrap``).
        """
        stages = self.config.pipeline if pipeline is None else pipeline
        if stages > 1:
            from hetero.trainer.pipeline.wrap import wrap_pipeline

            BY_NAME["pipeline"].check(stages)
            return wrap_pipeline(
                self,
                model,
                stages,
                microbatch=microbatch,
                schedule=schedule,
                loss_fn=loss_fn,
                example=example,
                split=split,
            )
        from hetero.trainer.wrapping import wrap_model

        return wrap_model(
            self,
            model,
            sync_batchnorm=sync_batchnorm,
            comm=comm,
            shard=shard,
            offload=offload,
            param_dtype=param_dtype,
            activation_checkpointing=activation_checkpointing,
            **ddp_kwargs,
        )

    # -- data -------------------------------------------------------------------------
    @property
    def job(self) -> JobTerms | None:
        """The job file's terms when a coordinator launched this rank (a ``command:``
        job): its name, global batch, steps or epochs, policy and rebalance interval;
        None outside such a job."""
        return self.env.job

    def loader(
        self,
        dataset: Dataset[Any] | Iterable[Any],
        global_batch: int | None = None,
        *,
        seed: int = 0,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        drop_last: bool = False,
        pin_memory: bool | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        split: str | None = None,
    ) -> Loader:
        """This rank's share of each global batch of ``global_batch`` samples: the job
        file's (``ctx.job``) when none is given; a different one in a job is a
        ``ConfigError`` naming both.

        Plans start from the policy's initial plan and change only at steps the
        exchange schedules, the same on every rank. ``num_workers`` DataLoader
        workers per rank, for the whole run: a plan change moves only the cut of
        each batch (``trainer.loader``). ``collate_fn`` makes a batch of a list of
        samples (default ``default_collate``), in the workers if there are any.

        A stream (an ``IterableDataset``, or any iterable without ``__getitem__``)
        gives a ``StreamLoader``: each rank draws its share from its part of the stream,
        ``split`` (``items``, the default: every R-th item; ``dataset``: the dataset
        yields its reader's part) saying how the parts are made, and an iteration is
        one pass, which ends for every rank where one rank's part runs out
        (``trainer.stream``). ``seed`` and ``drop_last`` are the map-style sampler's.
        """
        self._loader = open_loader(
            self,
            dataset,
            term(self.env.job, "global_batch", global_batch, None, "ctx.loader"),
            seed=seed,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            drop_last=drop_last,
            pin_memory=self.device.type == "cuda" if pin_memory is None else pin_memory,
            collate_fn=collate_fn,
            split=split,
        )
        return self._loader

    def set_plan(
        self, batches: Sequence[int], apply_at_step: int, reason: str = "set by user"
    ) -> None:
        """Schedule a plan by hand. Collective in effect: call it identically on every rank."""
        loader = self._require_loader()
        plan = tuple(int(b) for b in batches)
        loader.sampler.set_plan(plan, apply_at_step)
        self.plans.append(PlanRecord(self.plans[-1].version + 1, apply_at_step, plan, reason))

    def set_max_batch(self, caps: Sequence[int | None]) -> None:
        """Per-rank batch caps (samples) for every plan from now on (memory caps).

        Collective in effect: call it identically on every rank. The embedded
        planner's constraints take the caps; a plan already scheduled is not
        changed here (``hetero.trainer.memory.apply_caps`` does that).
        """
        self.max_batch = tuple(caps)
        if isinstance(self.planner, EmbeddedPlanner):
            constraints = replace(self.planner.constraints, max_batch=self.max_batch)
            self.planner = replace(self.planner, constraints=constraints)

    def _require_loader(self) -> Loader:
        if self._loader is None:
            raise ConfigError("call ctx.loader(dataset) before training")
        return self._loader

    def _begin_step(self, sizes: tuple[int, ...]) -> None:
        self._step_sizes = sizes
        self.weighting.scale = sizes[self.dp_rank] / sum(sizes)

    # -- the step ---------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with timing; ``loss`` is this rank's mean over its batch.

        The loss is scaled by ``b_i/B`` and the comm hook then only sums, so the
        objective is the global mean loss even when gradients of one rank
        depend on other ranks' samples (SyncBatchNorm). A loop that calls
        ``loss.backward()`` itself still gets exact gradients for models
        without cross-rank layers: the hook applies ``b_i/B`` instead.
        """
        if self.pipeline is not None:
            raise ConfigError("a pipeline stage runs its backward in model.step(x, y)")
        self._last_loss = loss.detach()
        sizes = self._step_sizes
        share = sizes[self.rank] / sum(sizes) if sizes else 1.0
        self.weighting.scale = 1.0
        (loss * share).backward()
        if not self._ddp:
            self.hooks.grads_ready()
        self.clock.mark("bwd_end")

    def step(self, loss: torch.Tensor | None = None) -> None:
        """Close the step (after ``optimizer.step()``); at a boundary, rebalance."""
        if not self._step_sizes:
            raise ConfigError("ctx.step() called before a batch was drawn from ctx.loader()")
        mine = self._step_sizes[self.dp_rank]
        if mine != self._last_batch:
            # The first batch size of a run (or of a resumed one) is no plan change.
            self._batch_switched = self._last_batch >= 0
            self._last_batch, self._batch_since = mine, self.global_step
        self.clock.end_step(self.global_step, mine)
        loss = loss.detach() if loss is not None else self._last_loss
        if loss is not None:
            weighted = loss.float() * mine
            acc = self._interval.loss_sum
            self._interval.loss_sum = weighted if acc is None else acc + weighted
        self._last_loss = None
        self._interval.samples += mine
        self._interval.global_samples += sum(self._step_sizes)
        self.global_step += 1
        self.progress.beat()
        if replan.is_boundary(self.global_step, self.config.rebalance_interval):
            rebalance(self)
        elif self.global_step == self._recheck_at:
            recheck(self)
        if self._stop is not None:
            self._stop.pace(self.summaries)
            self._stop.poll(self.global_step)

    def stop_on_sigterm(self, enabled: bool = True) -> None:
        """SIGTERM asks the ranks to agree in :meth:`step` on a step after which
        :attr:`stopping` is True on all (collective); ``False`` undoes it (``drain``)."""
        if enabled:
            self._stop = self._stop or StopRequest(self.world_size)
        elif self._stop is not None:
            stop, self._stop = self._stop, None
            stop.close()

    def probe_memory(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any], torch.Tensor],
        batch_fn: Callable[[int], Any] | None = None,
        *,
        margin: float = 0.1,
    ) -> tuple[int | None, ...] | None:
        """Measure each rank's peak memory before the first step and cap the first plan to
        fit (collective; after :meth:`loader`, before the loop). ``loss_fn(batch)`` is the
        mean loss of ``batch`` through ``model`` (the model :meth:`wrap` returned);
        ``batch_fn(n)``, ``n`` samples on this rank's device (default: the loader's
        dataset's first ``n``). Training is unchanged: no optimizer step, RNG and buffers
        restored. Returns the caps in force, ``None`` where nothing could be measured
        (CPU ranks). See ``hetero.trainer.memprobe``."""
        from hetero.trainer.memprobe import probe_memory

        return probe_memory(self, model, optimizer, loss_fn, batch_fn, margin=margin)

    def on_interval(self, fn: IntervalCallback, *, every_rank: bool = False) -> None:
        """Call ``fn(figures)`` at each rebalance boundary on rank 0 (every rank with
        ``every_rank``): the interval's figures as a plain dict, the job's and each rank's
        (fields: ``hetero.trainer.intervalhooks``). A callback that raises is logged once
        and never stops training."""
        self.interval_hooks.add(fn, every_rank)

    def evaluate(self, fn: Callable[[], Any]) -> dict[str, float]:
        """Run ``fn()`` (a mapping of metric names to numbers, e.g. ``{"accuracy": 0.91}``)
        outside the step clocks and record rank 0's result at this step (collective: call it
        on every rank at the same step). See ``hetero.trainer.evaluation``."""
        from hetero.trainer.evaluation import evaluate

        return evaluate(self, fn)

    # -- the outcome ------------------------------------------------------------------
    def measure_ideal(
        self,
        make_model: Callable[[], nn.Module],
        optimizer: torch.optim.Optimizer,
        dataset: Dataset[Any],
        loss_fn: Callable[[Any, Any], torch.Tensor],
        *,
        steps: int = 8,
        amp: str = "none",
        memory_format: torch.memory_format = torch.contiguous_format,
        seed: int = 0,
    ) -> list[Solo]:
        """Each rank alone at its batch of the plan that ran last: the ideal (collective).

        Ranks take turns (the others wait at a barrier), each running ``steps`` full
        steps on ``make_model()`` (a fresh copy of the model on this rank's device)
        with an optimizer like ``optimizer``; the batch is put on the device before
        each step's clock starts. Kept for :meth:`report`.
        """
        from hetero.trainer.ideal import measure_solo

        self.solo = measure_solo(
            self,
            make_model,
            optimizer,
            dataset,
            loss_fn,
            self.running_plan,
            steps=steps,
            seed=seed,
            amp=amp,
            memory_format=memory_format,
        )
        return self.solo

    def report(self, *, print_table: bool = True, file: TextIO | None = None) -> dict[str, Any]:
        """The run's summary: throughput, plans, the ideal (if measured) and the gap breakdown.

        Every rank returns it; rank 0 prints it (``print_table``) with a one-line
        verdict on where the throughput missing from the ideal went.
        """
        from hetero.trainer.runsummary import api_summary, print_report

        summary = api_summary(self)
        if print_table and self.rank == 0:
            print_report(summary, file)
        return summary

    # -- lifecycle ----------------------------------------------------------------------
    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self, *, failed: bool = False) -> None:
        """Flush metrics and leave the process group (at once, without waiting for
        the other ranks, if ``failed``: this rank stops on an error).

        The group, and Gloo's threads with it, ends here if the model that
        :meth:`wrap` returned is gone (``hetero-train`` drops it first), else when
        that model goes: its DDP reducer, or FSDP2's state, holds the group (see
        ``procgroup``).
        """
        self.metrics.close()
        if self._board is not None:
            self._board.close()
        if self.gpu is not None:
            self.gpu.stop()
        if self._loader is not None:
            self._loader.close()
            if isinstance(self._loader, StreamLoader):
                self._loader.ends.close(failed=failed)
        close_planner = getattr(self.planner, "close", None)
        if close_planner is not None:
            close_planner(failed=failed)
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop.close(failed=failed)
        if self.world_size > 1:
            procgroup.leave(failed=failed)
