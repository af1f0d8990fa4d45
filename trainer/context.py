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

``init`` joins the torch.distributed job described by the environment
(torchrun, ``hetero-train``, or an agent) or runs alone. ``wrap`` puts the model
in DDP with the exact-weighting comm hook and the timing hooks. ``loader``
yields this rank's share of each global batch. ``step`` closes the step and, at
each rebalance boundary, exchanges statistics and applies the next plan on
every rank at the same step.
"""

from __future__ import annotations

import collections
import logging
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, default_collate

from hetero.coordinator.balancer import (
    Constraints,
    DeviceProfile,
    Interval,
    make_policy,
)
from hetero.errors import ConfigError, DistributedError
from hetero.trainer import control, procgroup
from hetero.trainer.emulation import Slowdown, emulate_wait, parse_slowdowns
from hetero.trainer.exchange import (
    EmbeddedPlanner,
    Planner,
    RankSummary,
    all_gather_summaries,
    broadcast_plan,
)
from hetero.trainer.gradients import WeightingState, weighted_allreduce_hook
from hetero.trainer.metrics import MetricsWriter
from hetero.trainer.netif import interface_toward
from hetero.trainer.progress import ProgressFile
from hetero.trainer.sampler import UnevenBatchSampler
from hetero.trainer.timing import StepClock, StepTimes

log = logging.getLogger("hetero.trainer")
#: HETERO_DEBUG_TIMING=1 logs every step's phase times at each interval boundary.
_DEBUG_TIMING = os.environ.get("HETERO_DEBUG_TIMING") == "1"


#: Set by the coordinator for agent-launched ranks (the job spec's ``collective_timeout_s``).
COLLECTIVE_TIMEOUT_ENV = "HETERO_COLLECTIVE_TIMEOUT_S"
#: Seconds a collective waits for a peer outside an agent (torch's own default).
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0


def _collective_timeout_s() -> float:
    """``HETERO_COLLECTIVE_TIMEOUT_S`` if set (agent-launched jobs), else 600 s."""
    raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{COLLECTIVE_TIMEOUT_ENV}={raw!r} is not a number") from None
    if not value > 0:
        raise ConfigError(f"{COLLECTIVE_TIMEOUT_ENV} must be > 0, got {raw}")
    return value


@dataclass(frozen=True)
class TrainerConfig:
    """How a training process balances. Validated on construction."""

    policy: str = "dynamic"
    rebalance_interval: int = 10
    min_batch: int = 1
    max_batch: tuple[int | None, ...] | None = None
    emulate_slowdown: str | None = None
    output_dir: Path | None = None
    device: str = "auto"
    backend: str | None = None
    warmup_steps: int = 1
    settle_steps: int = 1
    history_intervals: int = 32
    #: Seconds a collective may wait for a peer before failing (a dead peer must not
    #: hang the job): ``HETERO_COLLECTIVE_TIMEOUT_S`` under an agent, else 600.
    collective_timeout_s: float = field(default_factory=_collective_timeout_s)

    def __post_init__(self) -> None:
        make_policy(self.policy)  # raises ConfigError naming the known ones
        if self.rebalance_interval < 1:
            raise ConfigError(f"rebalance_interval must be >= 1, got {self.rebalance_interval}")
        if self.min_batch < 1:
            raise ConfigError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.settle_steps < 0:
            raise ConfigError(f"settle_steps must be >= 0, got {self.settle_steps}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.backend not in (None, "gloo", "nccl"):
            raise ConfigError(f"backend must be gloo or nccl, got {self.backend!r}")
        if not self.collective_timeout_s > 0:
            raise ConfigError(f"collective_timeout_s must be > 0, got {self.collective_timeout_s}")
        parse_slowdowns(self.emulate_slowdown)


@dataclass
class PlanRecord:
    """A plan change as all ranks applied it."""

    version: int
    apply_at_step: int
    batches: tuple[int, ...]
    reason: str


@dataclass
class _Interval:
    """Accumulators of the interval in progress."""

    started_s: float = field(default_factory=time.perf_counter)
    loss_sum: torch.Tensor | None = None
    samples: int = 0
    global_samples: int = 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def _pick_device(choice: str, local_rank: int) -> torch.device:
    has_cuda = torch.cuda.is_available() and local_rank < torch.cuda.device_count()
    if choice == "cuda" and not has_cuda:
        raise ConfigError(f"device cuda requested but local rank {local_rank} has no GPU")
    if choice == "cuda" or (choice == "auto" and has_cuda):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _gloo_interface() -> None:
    """Point Gloo at the interface toward ``MASTER_ADDR`` unless the user chose one
    (``GLOO_SOCKET_IFNAME``): left alone it binds where the hostname resolves,
    which is loopback on many hosts, and ranks on other hosts cannot reach it."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    iface = interface_toward(os.environ.get("MASTER_ADDR", ""))
    if iface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        log.info("Gloo uses interface %s (toward MASTER_ADDR)", iface)


def _default_backend(device: torch.device) -> str:
    """NCCL only when every rank can be on CUDA, else Gloo; all ranks must agree.

    A launcher that knows the whole job (``hetero-train --nproc``, an agent, the
    coordinator) says so in ``HETERO_BACKEND``. Otherwise this rank infers it
    from its own node: NCCL if it is on CUDA and the node has a GPU for every
    local rank, so a node mixing GPU and CPU ranks picks Gloo on every rank.
    """
    chosen = os.environ.get("HETERO_BACKEND")
    if chosen:
        if chosen not in ("gloo", "nccl"):
            raise ConfigError(f"HETERO_BACKEND must be gloo or nccl, got {chosen!r}")
        return chosen
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    if device.type == "cuda" and torch.cuda.device_count() >= local_world:
        return "nccl"
    return "gloo"


class Context:
    """One training process's view of a hetero job. Create it with :func:`init`."""

    def __init__(self, config: TrainerConfig, *, profiles: Sequence[DeviceProfile] | None = None):
        self.config = config
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"RANK={self.rank} outside WORLD_SIZE={self.world_size}")
        self.device = _pick_device(config.device, self.local_rank)
        # Under an agent a user script's emulated slowdown arrives in the environment.
        slowdown_spec = config.emulate_slowdown or control.emulated_slowdown_from_env(self.rank)
        self.slowdowns: dict[int, Slowdown] = parse_slowdowns(slowdown_spec)
        bad = [r for r in self.slowdowns if r >= self.world_size]
        if bad:
            raise ConfigError(
                f"--emulate-slowdown names rank {bad[0]} of a {self.world_size}-rank job"
            )
        if self.slowdowns and self.device.type == "cuda":
            raise ConfigError("emulated slowdown is for CPU ranks; on GPUs use real load")
        self.emulated = bool(self.slowdowns)
        if profiles is not None and len(profiles) != self.world_size:
            raise ConfigError(f"{len(profiles)} device profiles for {self.world_size} ranks")
        self.profiles = profiles
        self.backend = config.backend or _default_backend(self.device)
        if self.backend == "nccl" and self.device.type != "cuda":
            raise ConfigError(f"rank {self.rank} has no GPU but the job's backend is NCCL")
        if self.world_size > 1 and not dist.is_initialized():
            if self.backend == "gloo":
                _gloo_interface()
            try:
                procgroup.join(
                    self.backend,
                    rank=self.rank,
                    world_size=self.world_size,
                    timeout=timedelta(seconds=config.collective_timeout_s),
                    device_id=self.device if self.device.type == "cuda" else None,
                )
            except (RuntimeError, ValueError) as exc:
                raise DistributedError(f"joining the process group failed: {exc}") from None
        self.progress = ProgressFile.from_env()
        self.progress.beat()
        self.clock = StepClock(self.device)
        self.weighting = WeightingState(on_grads_ready=self._on_grads_ready)
        self.metrics = MetricsWriter(config.output_dir, self.rank)
        self.history: collections.deque[Interval] = collections.deque(
            maxlen=config.history_intervals
        )
        self.plans: list[PlanRecord] = []
        self.summaries: list[list[RankSummary]] = []
        self.interval_walls: list[float] = []
        self.global_step = 0
        self.stats_from_step = config.warmup_steps
        self.planner: Planner | None = None
        self.max_batch: tuple[int | None, ...] | None = config.max_batch
        self._loader: HeteroLoader | None = None
        self._model: nn.Module | None = None
        self._ddp = False
        self._step_sizes: tuple[int, ...] = ()
        self._last_batch = -1
        self._batch_since = 0  # global step from which this rank ran its current batch size
        self._last_loss: torch.Tensor | None = None
        self._interval = _Interval()

    # -- properties -------------------------------------------------------------------
    @property
    def plan(self) -> tuple[int, ...]:
        """The latest plan scheduled (it may apply a few steps from now)."""
        return self._require_loader().sampler.schedule.plans[-1]

    @property
    def slowdown(self) -> Slowdown | None:
        return self.slowdowns.get(self.rank)

    def slowdown_at(self, step: int) -> float:
        s = self.slowdown
        return s.factor_at(step) if s else 1.0

    # -- model ------------------------------------------------------------------------
    def wrap(
        self, model: nn.Module, *, sync_batchnorm: bool = False, **ddp_kwargs: Any
    ) -> nn.Module:
        """Move ``model`` to this rank's device and wrap it for uneven-batch data parallelism.

        BatchNorm statistics are computed over each rank's own batch (as in
        plain DDP, where they come from B/W samples); pass ``sync_batchnorm=True``
        to compute them over the whole global batch instead.
        """
        model = model.to(self.device)
        model.register_forward_pre_hook(self._on_forward_begin)
        model.register_forward_hook(self._on_forward_end)
        self._model = model
        if self.world_size == 1:
            return model
        if sync_batchnorm:
            if self.device.type != "cuda":
                raise ConfigError("sync_batchnorm needs CUDA ranks (PyTorch's SyncBatchNorm)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, **ddp_kwargs)
        ddp.register_comm_hook(self.weighting, weighted_allreduce_hook)
        self._ddp = True
        return ddp

    def _on_forward_begin(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and not self.clock.seen("fwd_begin"):
            self.clock.mark("fwd_begin")

    def _on_forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            self.clock.mark("fwd_end")

    def _on_grads_ready(self) -> None:
        factor = self.slowdown_at(self.global_step)
        if factor > 1.0 and self.clock.seen("fwd_begin"):
            self.clock.injected_s += emulate_wait(factor, self.clock.since("fwd_begin"))
        self.clock.mark("grads_ready")

    # -- data -------------------------------------------------------------------------
    def loader(
        self,
        dataset: Dataset[Any],
        global_batch: int,
        *,
        seed: int = 0,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        drop_last: bool = False,
        pin_memory: bool | None = None,
    ) -> HeteroLoader:
        """This rank's share of each global batch of ``global_batch`` samples.

        Plans start from the policy's initial plan and change only at steps the
        exchange schedules, the same on every rank.
        """
        constraints = Constraints(
            global_batch, self.world_size, self.config.min_batch, self.max_batch
        )
        policy = make_policy(self.config.policy)
        # Under an agent every rank starts on the coordinator's plan (same env on all ranks).
        launched = control.launch_plan(constraints)
        initial = launched.batches if launched else policy.initial(constraints, self.profiles)
        sampler = UnevenBatchSampler(
            len(dataset),  # type: ignore[arg-type]
            initial,
            self.rank,
            seed=seed,
            min_batch=self.config.min_batch,
            drop_last=drop_last,
        )
        if self.planner is None:
            self.planner = control.planner_from_env(
                EmbeddedPlanner(policy, constraints, self.profiles),
                constraints,
                lambda: (self.global_step, self.summaries[-1] if self.summaries else None),
            )
        self.plans = [PlanRecord(0, 0, initial, f"initial ({policy.name})")]
        self._loader = HeteroLoader(
            self,
            dataset,
            sampler,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=self.device.type == "cuda" if pin_memory is None else pin_memory,
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

    def _require_loader(self) -> HeteroLoader:
        if self._loader is None:
            raise ConfigError("call ctx.loader(dataset, global_batch) before training")
        return self._loader

    def _begin_step(self, sizes: tuple[int, ...]) -> None:
        self._step_sizes = sizes
        self.weighting.scale = sizes[self.rank] / sum(sizes)

    # -- the step ---------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with timing; ``loss`` is this rank's mean over its batch.

        The loss is scaled by ``b_i/B`` and the comm hook then only sums, so the
        objective is the global mean loss even when gradients of one rank
        depend on other ranks' samples (SyncBatchNorm). A loop that calls
        ``loss.backward()`` itself still gets exact gradients for models
        without cross-rank layers: the hook applies ``b_i/B`` instead.
        """
        self._last_loss = loss.detach()
        sizes = self._step_sizes
        share = sizes[self.rank] / sum(sizes) if sizes else 1.0
        self.weighting.scale = 1.0
        (loss * share).backward()
        if not self._ddp:
            self._on_grads_ready()
        self.clock.mark("bwd_end")

    def step(self, loss: torch.Tensor | None = None) -> None:
        """Close the step (after ``optimizer.step()``); at a boundary, rebalance."""
        if not self._step_sizes:
            raise ConfigError("ctx.step() called before a batch was drawn from ctx.loader()")
        mine = self._step_sizes[self.rank]
        if mine != self._last_batch:
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
        if self.global_step % self.config.rebalance_interval == 0:
            self._rebalance()

    def _summarize(self, times: list[StepTimes]) -> RankSummary:
        """This rank's interval: steps at the current batch, after it has settled.

        The first ``settle_steps`` steps at a new batch size are left out: new
        shapes cost allocator and kernel-selection work once, and on GPUs that
        made every rank look ~15% slower for the interval right after each plan
        change. Compute and step time are medians, robust to a stray slow step
        (a page fault, a collector pause); phases are means.
        """
        valid = [t for t in times if t.step >= self.stats_from_step]
        current = self._step_sizes[self.rank]
        sel = [t for t in valid if t.batch == current]
        settled = [t for t in sel if t.step >= self._batch_since + self.config.settle_steps]
        sel = settled or sel
        n = len(sel)

        def mean(attr: str) -> float:
            return sum(getattr(t, attr) for t in sel) / n if n else 0.0

        def median(attr: str) -> float:
            return statistics.median(getattr(t, attr) for t in sel) if n else 0.0

        loss_sum = (
            float(self._interval.loss_sum.item()) if self._interval.loss_sum is not None else 0.0
        )
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return RankSummary(
            rank=self.rank,
            batch=current,
            steps=n,
            compute_s=median("compute_s"),
            step_s=median("step_s"),
            data_s=mean("data_s"),
            forward_s=mean("forward_s"),
            backward_s=mean("backward_s"),
            comm_s=mean("comm_s"),
            optimizer_s=mean("optimizer_s"),
            injected_s=mean("injected_s"),
            loss_sum=loss_sum,
            samples=self._interval.samples,
            peak_memory_bytes=peak,
            slowdown=self.slowdown_at(self.global_step - 1),
        )

    def _rebalance(self) -> None:
        loader = self._require_loader()
        times = self.clock.resolve()
        if _DEBUG_TIMING:
            for t in times:
                print(f"rank {self.rank} step timing {t}", file=sys.stderr, flush=True)
        mine = self._summarize(times)
        try:
            summaries = all_gather_summaries(mine, self.world_size, self.device)
        except RuntimeError as exc:
            raise DistributedError(
                f"stats exchange at step {self.global_step} failed: {exc}"
            ) from None
        wall_s = time.perf_counter() - self._interval.started_s
        if all(s.steps > 0 for s in summaries):
            self.history.append(tuple(s.to_interval() for s in summaries))
        # Before deciding: a planner under an agent reports this interval's summaries.
        self.summaries.append(summaries)
        current = self.plan
        decision: tuple[bool, int, int, tuple[int, ...]] | None = None
        reason = ""
        if self.rank == 0:
            decision, reason = self._decide(current, loader.prefetch_depth)
        try:
            changed, version, apply_at, plan = broadcast_plan(
                decision, self.world_size, self.device
            )
        except RuntimeError as exc:
            raise DistributedError(
                f"plan broadcast at step {self.global_step} failed: {exc}"
            ) from None
        if changed:
            loader.sampler.set_plan(plan, apply_at)
            self.plans.append(PlanRecord(version, apply_at, plan, reason))
        self.interval_walls.append(wall_s)
        self._write_metrics(summaries, wall_s, changed, plan, apply_at, reason)
        self._interval = _Interval()
        self.clock.restart()

    def _decide(
        self, current: tuple[int, ...], depth: int
    ) -> tuple[tuple[bool, int, int, tuple[int, ...]], str]:
        """Rank 0 only. Never raises: a failing planner keeps the current plan."""
        version = self.plans[-1].version
        if not self.history or self.planner is None:
            return (False, version, self.global_step, current), "no complete interval yet"
        try:
            d = self.planner.decide(tuple(self.history), current)
        except Exception as exc:  # the control plane must never stop training
            log.warning("planner failed at step %d, keeping the plan: %s", self.global_step, exc)
            return (False, version, self.global_step, current), f"planner failed: {exc}"
        if not d.changed or tuple(d.batches) == current:
            return (False, version, self.global_step, current), d.reason
        return (True, version + 1, self.global_step + depth, tuple(d.batches)), d.reason

    def _write_metrics(
        self,
        summaries: list[RankSummary],
        wall_s: float,
        changed: bool,
        plan: tuple[int, ...],
        apply_at: int,
        reason: str,
    ) -> None:
        me = summaries[self.rank]
        total_loss = sum(s.loss_sum for s in summaries)
        total_samples = sum(s.samples for s in summaries)
        record: dict[str, Any] = {
            "step": self.global_step,
            "rank": self.rank,
            "time_s": time.time(),
            "interval_wall_s": wall_s,
            "samples_per_s": total_samples / wall_s if wall_s > 0 else 0.0,
            "loss": total_loss / total_samples if total_samples else None,
            "local_loss": me.loss_sum / me.samples if me.samples else None,
            "batch": me.batch,
            "steps_measured": me.steps,
            "compute_s": me.compute_s,
            "per_sample_compute_s": me.compute_s / me.batch if me.batch else None,
            "phases_s": {
                "data": me.data_s,
                "forward": me.forward_s,
                "backward": me.backward_s,
                "comm": me.comm_s,
                "optimizer": me.optimizer_s,
            },
            "step_s": me.step_s,
            "peak_memory_bytes": me.peak_memory_bytes,
            "plan": list(self._step_sizes),  # the plan that ran in this interval
            "plan_changed": changed,
            "next_plan": list(plan) if changed else None,
            "apply_at_step": apply_at if changed else None,
            "reason": reason if self.rank == 0 else None,
            "emulated": self.emulated,
            "slowdown": me.slowdown,
            "injected_s": me.injected_s,
        }
        self.metrics.write(record)

    # -- lifecycle ----------------------------------------------------------------------
    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        """Flush metrics and leave the process group.

        The group, and Gloo's threads with it, ends here if the model that
        :meth:`wrap` returned is gone (``hetero-train`` drops it first), else when
        that model goes: its DDP reducer holds the group (see ``procgroup``).
        """
        self.metrics.close()
        close_planner = getattr(self.planner, "close", None)
        if close_planner is not None:
            close_planner()
        if self.world_size > 1:
            procgroup.leave()


class HeteroLoader:
    """Iterates one epoch of this rank's batches, already on the rank's device.

    Datasets with a ``get_batch(indices, device)`` method are gathered directly
    (fast, no worker processes); others go through a ``DataLoader`` whose
    ``batch_sampler`` is the uneven sampler. A loader that prefetches ``depth``
    batches gets plan changes scheduled ``depth`` steps ahead.
    """

    def __init__(
        self,
        ctx: Context,
        dataset: Dataset[Any],
        sampler: UnevenBatchSampler,
        *,
        num_workers: int,
        prefetch_factor: int,
        pin_memory: bool,
    ) -> None:
        self.ctx = ctx
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = num_workers
        self.fast = hasattr(dataset, "get_batch") and num_workers == 0
        self.prefetch_depth = num_workers * prefetch_factor if num_workers > 0 else 0
        self._dataloader: DataLoader[Any] | None = None
        if not self.fast:
            self._dataloader = DataLoader(
                dataset,
                batch_sampler=sampler,
                num_workers=num_workers,
                prefetch_factor=prefetch_factor if num_workers > 0 else None,
                pin_memory=pin_memory,
            )
        self._consumed = (sampler.epoch, sampler.step_in_epoch, sampler.global_step)

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch - self._consumed[1]

    @property
    def epoch(self) -> int:
        return self._position()[0]

    def _position(self) -> tuple[int, int, int]:
        epoch, step_in_epoch, gstep = self._consumed
        if step_in_epoch >= self.sampler.steps_per_epoch:
            return epoch + 1, 0, gstep
        return epoch, step_in_epoch, gstep

    def _fetch(self, indices: list[int]) -> Any:
        if self.fast:
            return self.dataset.get_batch(indices, self.ctx.device)  # type: ignore[attr-defined]
        return default_collate([self.dataset[i] for i in indices])

    def __iter__(self) -> Iterator[Any]:
        s = self.sampler
        s.epoch, s.step_in_epoch, s.global_step = self._position()
        epoch, step_in_epoch, gstep = s.epoch, s.step_in_epoch, s.global_step
        source: Iterator[Any]
        if self._dataloader is not None:
            source = iter(self._dataloader)
        else:
            source = (self._fetch(idx) for idx in s)
        for batch in source:
            sizes = s.batches_at(step_in_epoch, gstep)
            s.schedule.prune(gstep)
            self.ctx._begin_step(sizes)
            step_in_epoch += 1
            gstep += 1
            self._consumed = (epoch, step_in_epoch, gstep)
            yield _to_device(batch, self.ctx.device)

    def redraw(self, plan: Sequence[int]) -> Any:
        """This rank's share of the step last yielded, cut again by ``plan``.

        For retrying a step (a rank ran out of memory): the step's global
        samples stay the same and only the cut between ranks moves, so nothing
        is dropped or seen twice. Call it identically on every rank.
        """
        s = self.sampler
        epoch, step_in_epoch, _ = self._consumed
        step_in_epoch -= 1
        sizes = s.cut(tuple(plan), step_in_epoch)
        start = step_in_epoch * s.global_batch + sum(sizes[: self.ctx.rank])
        indices = s._permutation(epoch)[start : start + sizes[self.ctx.rank]]
        self.ctx._begin_step(sizes)
        return _to_device(self._fetch(indices), self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        state = self.sampler.state_dict()
        state["epoch"], state["step_in_epoch"], state["global_step"] = self._position()
        return state

    def load_state_dict(self, state: dict[str, Any], plans: bool = True) -> None:
        """Restore the position; ``plans=False`` keeps this run's plans (another world size)."""
        self.sampler.load_state_dict(state, plans=plans)
        self._consumed = (self.sampler.epoch, self.sampler.step_in_epoch, self.sampler.global_step)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def init(
    policy: str = "dynamic",
    *,
    rebalance_interval: int = 10,
    profiles: Sequence[DeviceProfile] | None = None,
    **options: Any,
) -> Context:
    """Join the job described by the environment (or run alone) and return its context.

    ``options`` are :class:`TrainerConfig` fields (``output_dir``,
    ``emulate_slowdown``, ``min_batch``, ``device``, ``backend``, …).
    """
    if "output_dir" in options and options["output_dir"] is not None:
        options["output_dir"] = Path(options["output_dir"])
    try:
        config = TrainerConfig(policy=policy, rebalance_interval=rebalance_interval, **options)
    except TypeError as exc:
        raise ConfigError(f"init(): {exc}") from None
    return Context(config, profiles=profiles)
