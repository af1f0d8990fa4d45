"""A built-in training job, written with the same public API a user's loop uses.

``run_job`` runs inside every rank: it builds the model and dataset, trains for
``steps`` steps under the chosen policy, checkpoints, measures each rank alone
for the ideal throughput, and (on rank 0) returns the summary.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hetero.core import defaults
from hetero.core.balancer import DeviceProfile
from hetero.core.errors import ConfigError, DistributedError, HeteroError
from hetero.trainer.checkpoint import load_checkpoint, save_checkpoint
from hetero.trainer.context import Context, init
from hetero.trainer.control import AgentPlanner
from hetero.trainer.datasets import TEXT_DATASETS, build_dataset
from hetero.trainer.emulation import format_slowdowns
from hetero.trainer.ideal import measure_solo
from hetero.trainer.memory import MemoryMonitor, describe, parse_max_batch
from hetero.trainer.models import model_info
from hetero.trainer.oom import OomGuard
from hetero.trainer.precision import Autocast, autocast, check_amp, grad_scaler
from hetero.trainer.runsummary import gap_fields
from hetero.trainer.simulate import apply_memory_fraction, parse_fractions
from hetero.trainer.tasks import Task, evaluate, make_task


@dataclass(frozen=True)
class JobConfig:
    """Everything ``hetero-train`` needs to run a built-in job. Validated on construction."""

    model: str = "simple_cnn"
    dataset: str = "synthetic"
    data_dir: str | None = None
    global_batch: int = 96
    steps: int = 100
    policy: str = "dynamic"
    rebalance_interval: int = defaults.REBALANCE_INTERVAL_STEPS
    min_batch: int = 1
    lr: float | None = None  # None: 0.05 for SGD, 6e-4 for AdamW
    seed: int = 0
    image_size: int | None = None
    num_classes: int = 10
    num_samples: int = 8192
    num_workers: int = 0
    emulate_slowdown: str | None = None
    device: str = "auto"
    output_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_interval: int = 0
    resume: str | None = None
    ideal_steps: int = 8
    sync_batchnorm: bool = False
    amp: str = "none"
    seq_len: int | None = None
    optimizer: str = "auto"
    zero: bool = False
    activation_checkpointing: bool = False
    max_batch: str | None = None
    memory_caps: bool = True
    memory_margin: float = 0.1
    oom_retry: bool = False
    simulate_nodes: int = 0
    memory_fraction: str | None = None
    tensorboard: str | None = None
    eval_samples: int = 512
    channels_last: bool = False
    backend: str | None = None
    compute_scores: str | None = None
    quiet: bool = False

    def __post_init__(self) -> None:
        model_info(self.model)
        for name in ("global_batch", "steps", "rebalance_interval", "min_batch", "num_samples"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        for name in ("checkpoint_interval", "ideal_steps", "num_workers", "seed", "eval_samples"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        check_amp(self.amp)
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}")
        if self.seq_len is not None and self.seq_len < 1:
            raise ConfigError(f"--seq-len must be >= 1, got {self.seq_len}")
        text_model = model_info(self.model).task != "classification"
        if text_model != (self.dataset in TEXT_DATASETS):
            kinds = "a text dataset (synthetic-text, text)" if text_model else "an image dataset"
            raise ConfigError(f"model {self.model} needs {kinds}, not {self.dataset!r}")
        if self.activation_checkpointing and not text_model:
            raise ConfigError(
                "--activation-checkpointing is implemented for the transformer models"
            )
        if not 0.0 <= self.memory_margin < 1.0:
            raise ConfigError(f"--memory-margin must be in [0, 1), got {self.memory_margin}")
        if self.simulate_nodes < 0:
            raise ConfigError(f"--simulate-nodes must be >= 0, got {self.simulate_nodes}")
        parse_fractions(self.memory_fraction, 1)
        self.profiles()  # validates --compute-scores
        if self.checkpoint_interval and not self.checkpoint_path:
            raise ConfigError("--checkpoint-interval needs --checkpoint-dir or --output-dir")

    def profiles(self) -> list[DeviceProfile] | None:
        """Per-rank relative speeds from ``--compute-scores`` (for ``proportional``/``hybrid``)."""
        if not self.compute_scores:
            return None
        try:
            scores = [float(x) for x in self.compute_scores.split(",")]
        except ValueError:
            raise ConfigError(
                f"--compute-scores must be numbers separated by commas, got {self.compute_scores!r}"
            ) from None
        if any(not x > 0 for x in scores):
            raise ConfigError(f"--compute-scores must all be > 0, got {self.compute_scores!r}")
        return [DeviceProfile(f"rank{r}", x) for r, x in enumerate(scores)]

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    @property
    def checkpoint_path(self) -> Path | None:
        base = self.checkpoint_dir or (
            Path(self.output_dir) / "checkpoints" if self.output_dir else None
        )
        return Path(base) / "last.pt" if base else None


OPTIMIZERS = ("auto", "sgd", "adamw")


def make_optimizer(
    cfg: JobConfig, task: Task, model: nn.Module, world_size: int
) -> torch.optim.Optimizer:
    """SGD with momentum for image models, AdamW for language models (``auto``); ZeRO on request.

    ``--zero`` shards the optimizer state over the ranks
    (``ZeroRedundancyOptimizer``); alone, a rank keeps the plain optimizer.
    """
    kind = cfg.optimizer if cfg.optimizer != "auto" else ("adamw" if task.text else "sgd")
    cls: type[torch.optim.Optimizer]
    kwargs: dict[str, Any]
    if kind == "sgd":
        cls, kwargs = torch.optim.SGD, {"lr": cfg.lr or 0.05, "momentum": 0.9}
    else:
        cls = torch.optim.AdamW
        kwargs = {"lr": cfg.lr or 6e-4, "betas": (0.9, 0.95), "weight_decay": 0.01}
    if cfg.zero and world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kwargs)
    return cls(model.parameters(), **kwargs)


def _local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer a single process would use (ZeRO's local one), for the ideal."""
    return getattr(optimizer, "optim", optimizer)


_PEER_FAILURE = ("Connection closed by peer", "Connection reset by peer", "timed out", "Timeout")


def as_distributed_error(exc: RuntimeError, step: int) -> Exception:
    """A backend failure caused by a peer as a one-line ``DistributedError``; others unchanged."""
    text = str(exc)
    if isinstance(exc, torch.distributed.DistBackendError) or any(p in text for p in _PEER_FAILURE):
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return DistributedError(f"lost a peer at step {step}: {first[:200]}")
    return exc


def _progress(ctx: Context, cfg: JobConfig, t0: float) -> None:
    if ctx.rank != 0 or cfg.quiet or not ctx.summaries:
        return
    n_intervals = max(cfg.steps // cfg.rebalance_interval, 1)
    every = max(n_intervals // 20, 1)
    if len(ctx.summaries) % every and ctx.global_step < cfg.steps:
        return
    s = ctx.summaries[-1]
    samples = sum(r.samples for r in s)
    loss = sum(r.loss_sum for r in s) / samples if samples else float("nan")
    rec_wall = time.perf_counter() - t0
    tag = " (emulated slowdown)" if ctx.emulated else ""
    print(
        f"step {ctx.global_step:>6}/{cfg.steps}  loss {loss:7.4f}  "
        f"plan {list(ctx.plan)}  compute/sample ms "
        f"{[round(r.compute_s / r.batch * 1e3, 2) if r.batch else None for r in s]}  "
        f"{rec_wall:6.1f}s{tag}",
        flush=True,
    )


def run_job(cfg: JobConfig) -> dict[str, Any] | None:
    """Train; return the summary on rank 0 (``None`` elsewhere)."""
    torch.manual_seed(cfg.seed)
    ctx = init(
        cfg.policy,
        rebalance_interval=cfg.rebalance_interval,
        min_batch=cfg.min_batch,
        emulate_slowdown=cfg.emulate_slowdown,
        output_dir=cfg.output_dir,
        device=cfg.device,
        # Simulated nodes share one GPU, which NCCL refuses; Gloo moves CUDA tensors.
        backend=cfg.backend or ("gloo" if cfg.simulate_nodes else None),
        profiles=cfg.profiles(),
    )
    try:
        return _train(ctx, cfg)
    except torch.OutOfMemoryError:
        raise HeteroError(
            f"out of memory at step {ctx.global_step} (batch {_my_batch(ctx)}); retry such steps "
            f"with --oom-retry, or cap batches with --max-batch"
        ) from None
    except RuntimeError as exc:
        # A peer that died or hung surfaces as a backend RuntimeError on the
        # survivors: report it in one line (the failing rank reports its own cause).
        raise as_distributed_error(exc, ctx.global_step) from None
    finally:
        ctx.close()


def _my_batch(ctx: Context) -> int | str:
    sizes = ctx._step_sizes
    return sizes[ctx.rank] if sizes else "?"


def _build(ctx: Context, cfg: JobConfig) -> tuple[Task, nn.Module, Any, Callable[[], nn.Module]]:
    """The task, the model (on no device yet), the training dataset, a factory of fresh models."""
    info = model_info(cfg.model)
    task = make_task(info.task)
    if task.text:
        seq_len = cfg.seq_len or info.default_image_size

        def fresh() -> nn.Module:
            return info.build(0, seq_len)

        raw = fresh()
        lm: Any = raw
        max_len = int(lm.config.max_seq_len)
        if seq_len > max_len:
            raise ConfigError(f"--seq-len {seq_len} exceeds {cfg.model}'s {max_len} positions")
        data = build_dataset(
            cfg.dataset,
            image_size=0,
            num_classes=0,
            num_samples=cfg.num_samples,
            data_dir=cfg.data_dir,
            seed=cfg.seed,
            seq_len=seq_len,
            vocab_size=task.data_vocab(raw),
        )
    else:
        image_size = cfg.image_size or info.default_image_size
        data = build_dataset(
            cfg.dataset,
            image_size=image_size,
            num_classes=cfg.num_classes,
            num_samples=cfg.num_samples,
            data_dir=cfg.data_dir,
            seed=cfg.seed,
        )
        num_classes = getattr(data, "num_classes", cfg.num_classes)

        def fresh() -> nn.Module:
            return info.build(num_classes, image_size)

        raw = fresh()

    def configured() -> nn.Module:
        m: Any = fresh()
        if cfg.activation_checkpointing:
            m.activation_checkpointing = True  # the transformers' switch (JobConfig checks)
        return m

    if cfg.activation_checkpointing:
        checkpointed: Any = raw
        checkpointed.activation_checkpointing = True
    return task, raw, task.prepare(data, raw, seed=cfg.seed), configured


def _train(ctx: Context, cfg: JobConfig) -> dict[str, Any] | None:
    fraction = apply_memory_fraction(ctx, parse_fractions(cfg.memory_fraction, ctx.world_size))
    if fraction is None and cfg.memory_fraction and ctx.rank == 0:
        print("hetero-train: --memory-fraction ignored on CPU ranks (CUDA only)", file=sys.stderr)
    caps = parse_max_batch(cfg.max_batch, ctx.world_size)
    if caps is not None:
        ctx.set_max_batch(caps)
    task, raw, dataset, fresh = _build(ctx, cfg)
    memory_format = cfg.memory_format if not task.text else torch.contiguous_format
    raw = raw.to(memory_format=memory_format)
    model = ctx.wrap(raw, sync_batchnorm=cfg.sync_batchnorm)
    optimizer = make_optimizer(cfg, task, model, ctx.world_size)
    zero = optimizer is not _local_optimizer(optimizer)
    loader = ctx.loader(dataset, cfg.global_batch, seed=cfg.seed, num_workers=cfg.num_workers)
    if cfg.resume:
        path = Path(cfg.resume) if cfg.resume != "auto" else cfg.checkpoint_path
        if path is None:
            raise ConfigError("--resume auto needs --checkpoint-dir or --output-dir")
        if cfg.resume == "auto" and not path.is_file():
            # A restarted job that failed before its first checkpoint starts over.
            if ctx.rank == 0 and not cfg.quiet:
                print(f"no checkpoint at {path} yet: starting from step 0", flush=True)
        else:
            load_checkpoint(path, ctx, model, optimizer)
            if ctx.rank == 0 and not cfg.quiet:
                print(f"resumed from {path} at step {ctx.global_step}", flush=True)
    start_step = ctx.global_step
    monitor = MemoryMonitor(
        ctx,
        margin=cfg.memory_margin,
        configured=caps,
        fraction=fraction,
        measure=cfg.memory_caps,
    )
    guard = OomGuard(ctx, model, monitor) if cfg.oom_retry else None
    scaler = grad_scaler(ctx.device, cfg.amp)
    board = None
    if cfg.tensorboard:
        from hetero.trainer.tensorboard import TensorBoardWriter

        board = TensorBoardWriter(cfg.tensorboard, ctx.rank)
    if ctx.rank == 0 and not cfg.quiet:
        emu = f", EMULATED slowdown {format_slowdowns(ctx.slowdowns)}" if ctx.emulated else ""
        sim = f", SIMULATED {cfg.simulate_nodes} nodes on one device" if cfg.simulate_nodes else ""
        print(
            f"hetero-train: {cfg.model} ({task.name}) on {cfg.dataset}, {ctx.world_size} rank(s) "
            f"[{ctx.backend}/{ctx.device.type}], global batch {cfg.global_batch}, policy "
            f"{cfg.policy}, rebalance every {cfg.rebalance_interval} steps{emu}{sim}",
            file=sys.stdout,
            flush=True,
        )

    def compute(batch: Any) -> torch.Tensor:
        x, y = batch
        if memory_format is not torch.contiguous_format:
            x = x.contiguous(memory_format=memory_format)
        with autocast(ctx.device, cfg.amp):
            loss = task.loss(model(x), y)
        ctx.backward(scaler.scale(loss) if scaler is not None else loss)
        return loss

    def checkpoint() -> None:
        assert cfg.checkpoint_path is not None
        if zero:
            optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
        save_checkpoint(cfg.checkpoint_path, ctx, model, optimizer)

    t0 = time.perf_counter()
    model.train()
    while ctx.global_step < cfg.steps:
        for batch in loader:
            if guard is not None:
                batch, loss = guard.run(batch, compute)
            else:
                loss = compute(batch)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ctx.step(loss)
            monitor.after_step(int(batch[0].shape[0]))
            if board is not None:
                board.after_step(ctx, monitor.caps[ctx.rank] if monitor.caps else None)
            if ctx.global_step % cfg.rebalance_interval == 0:
                _progress(ctx, cfg, t0)
            if cfg.checkpoint_interval and ctx.global_step % cfg.checkpoint_interval == 0:
                checkpoint()
            if ctx.global_step >= cfg.steps:
                break
    train_wall_s = time.perf_counter() - t0
    if board is not None:
        board.close()
    if cfg.checkpoint_path and cfg.checkpoint_interval:
        checkpoint()

    evaluation: dict[str, Any] = {}
    if cfg.eval_samples and ctx.rank == 0:
        # Rank 0's own batch: it trained at that size, so it fits its memory (cap).
        evaluation = _evaluate(ctx, cfg, task, raw, dataset, ctx.plan[ctx.rank])
    final_plan = ctx.plan
    standalone: list[float] = []
    side_by_side: list[float] = []
    solos = None
    if cfg.ideal_steps > 0:

        def fresh_copy() -> nn.Module:
            m = fresh().to(ctx.device).to(memory_format=memory_format)
            m.load_state_dict(raw.state_dict())
            return Autocast(m, ctx.device, cfg.amp) if cfg.amp != "none" else m

        for concurrent in (
            # The same on every rank (a collective): Gloo jobs share a host CPU somewhere.
            (False, True) if ctx.backend == "gloo" and ctx.world_size > 1 else (False,)
        ):
            measured = measure_solo(
                ctx,
                fresh_copy,
                _local_optimizer(optimizer),
                dataset,
                task.loss,
                ctx.running_plan,  # a plan scheduled at the last boundary never ran
                steps=cfg.ideal_steps,
                seed=cfg.seed,
                concurrent=concurrent,
                memory_format=memory_format,
            )
            (side_by_side if concurrent else standalone).extend(s.samples_per_s for s in measured)
            solos = solos or measured
    if ctx.rank != 0:
        return None
    summary = summarize(ctx, cfg, start_step, train_wall_s, final_plan, standalone, side_by_side)
    summary.update(evaluation)
    summary.update(gap_fields(ctx, solos, summary["steady_samples_per_s"]))
    summary.update(
        task=task.name,
        seq_len=(cfg.seq_len or model_info(cfg.model).default_image_size) if task.text else None,
        amp=cfg.amp,
        zero=zero,
        activation_checkpointing=cfg.activation_checkpointing,
        optimizer=type(_local_optimizer(optimizer)).__name__,
        parameters=sum(p.numel() for p in raw.parameters()),
        memory_caps=list(monitor.caps) if monitor.caps else None,
        memory_caps_text=describe(monitor.caps),
        per_rank_peak_memory_bytes=[
            max(iv[r].peak_memory_bytes for iv in ctx.summaries) for r in range(ctx.world_size)
        ]
        if ctx.summaries
        else None,
        oom_retries=[
            {
                "step": e.step,
                "failed": {str(r): b for r, b in e.failed.items()},
                "plan": list(e.plan),
                "injected": e.injected,
            }
            for e in (guard.events if guard is not None else [])
        ],
        simulated_nodes=cfg.simulate_nodes or None,
        memory_fraction=parse_fractions(cfg.memory_fraction, ctx.world_size),
        samples_per_epoch=len(dataset),
        time_per_epoch_s=train_wall_s
        * len(dataset)
        / max((ctx.global_step - start_step) * cfg.global_batch, 1),
    )
    return summary


def _evaluate(
    ctx: Context, cfg: JobConfig, task: Task, raw: nn.Module, train_set: Any, batch: int
) -> dict[str, Any]:
    """Rank 0 only, on the unwrapped model (no collectives): CIFAR's test split, else training data."""
    split = "train"
    data = train_set
    if cfg.dataset in ("cifar10", "cifar100"):
        test = build_dataset(
            cfg.dataset, image_size=0, num_classes=0, data_dir=cfg.data_dir, train=False
        )
        if len(test):  # type: ignore[arg-type]
            data, split = task.prepare(test, raw, seed=cfg.seed), "test"
    model = Autocast(raw, ctx.device, cfg.amp) if cfg.amp != "none" else raw
    result: dict[str, Any] = evaluate(
        model, data, task, ctx.device, samples=cfg.eval_samples, batch=batch
    )
    result["eval_split"] = split
    return result


def summarize(
    ctx: Context,
    cfg: JobConfig,
    start_step: int,
    train_wall_s: float,
    final_plan: tuple[int, ...],
    standalone: list[float],
    side_by_side: list[float] | None = None,
) -> dict[str, Any]:
    """The run's result: throughput (whole run and steady state), plan, ideal, emulation."""
    intervals = ctx.summaries
    rates: list[float] = []
    samples_after_first = 0
    wall_after_first = 0.0
    for k, (iv, wall) in enumerate(zip(intervals, ctx.interval_walls, strict=True)):
        n = sum(r.samples for r in iv)
        if wall > 0:
            rates.append(n / wall)
        if k > 0:
            samples_after_first += n
            wall_after_first += wall
    steady_window = rates[len(rates) // 2 :] or rates
    steady = statistics.median(steady_window) if steady_window else 0.0
    overall = samples_after_first / wall_after_first if wall_after_first > 0 else steady
    # A rank whose standalone measurement ran out of memory reports 0: no ideal then.
    ideal = sum(standalone) if standalone and all(r > 0 for r in standalone) else None
    last = intervals[-1] if intervals else []
    losses = [sum(r.loss_sum for r in iv) / max(sum(r.samples for r in iv), 1) for iv in intervals]
    return {
        "policy": cfg.policy,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "steps": ctx.global_step,
        "steps_this_run": ctx.global_step - start_step,
        "global_batch": cfg.global_batch,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "throughput_samples_per_s": overall,
        "steady_samples_per_s": steady,
        "train_wall_s": train_wall_s,
        "final_plan": list(final_plan),
        "plan_changes": len(ctx.plans) - 1,
        "plans": [asdict(p) | {"batches": list(p.batches)} for p in ctx.plans],
        "per_rank_compute_s": [r.compute_s for r in last],
        "per_rank_per_sample_ms": [r.compute_s / r.batch * 1e3 if r.batch else None for r in last],
        "channels_last": cfg.channels_last,
        "control_plane": ctx.planner.stats() if isinstance(ctx.planner, AgentPlanner) else None,
        "emulated": ctx.emulated,
        "emulated_slowdown": format_slowdowns(ctx.slowdowns) or None,
        "ideal_samples_per_s": ideal,
        "ideal_method": (
            f"sum over ranks of each rank's standalone throughput at its final planned batch, "
            f"measured one rank at a time after training, the batch on the device "
            f"({cfg.ideal_steps} steps each, median)"
            if standalone
            else "not measured (--ideal-steps 0)"
        ),
        "standalone_samples_per_s": standalone,
        "pct_of_ideal": 100.0 * steady / ideal if ideal else None,
        # CPU only: the ranks measured at the same time, sharing the host's cores.
        "side_by_side_samples_per_s": sum(side_by_side) if side_by_side else None,
        "pct_of_side_by_side": 100.0 * steady / sum(side_by_side) if side_by_side else None,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "interval_losses": losses,
    }
