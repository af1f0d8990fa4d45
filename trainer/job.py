"""A built-in training job, written with the same public API a user's loop uses.

``run_job`` runs inside every rank: it builds the model and dataset, trains for
``steps`` steps under the chosen policy, checkpoints, measures each rank alone
for the ideal throughput, and (on rank 0) returns the summary.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hetero.coordinator.balancer import DeviceProfile
from hetero.errors import ConfigError, DistributedError
from hetero.trainer.checkpoint import load_checkpoint, save_checkpoint
from hetero.trainer.context import Context, init
from hetero.trainer.control import AgentPlanner
from hetero.trainer.datasets import build_dataset
from hetero.trainer.emulation import format_slowdowns
from hetero.trainer.ideal import measure_standalone
from hetero.trainer.models import model_info


@dataclass(frozen=True)
class JobConfig:
    """Everything ``hetero-train`` needs to run a built-in job. Validated on construction."""

    model: str = "simple_cnn"
    dataset: str = "synthetic"
    data_dir: str | None = None
    global_batch: int = 96
    steps: int = 100
    policy: str = "dynamic"
    rebalance_interval: int = 10
    min_batch: int = 1
    lr: float = 0.05
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
        for name in ("checkpoint_interval", "ideal_steps", "num_workers", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if self.lr <= 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if self.amp not in AMP_MODES:
            raise ConfigError(f"--amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
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
    def checkpoint_path(self) -> Path | None:
        base = self.checkpoint_dir or (
            Path(self.output_dir) / "checkpoints" if self.output_dir else None
        )
        return Path(base) / "last.pt" if base else None


#: Mixed-precision modes of ``--amp``. bf16 keeps fp32's exponent range, so it needs no scaler.
AMP_MODES = ("none", "bf16")


def autocast(device: torch.device, amp: str) -> torch.autocast:
    """Autocast for forward and loss: bf16 when ``amp == "bf16"``, a no-op otherwise."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp == "bf16")


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
        backend=cfg.backend,
        profiles=cfg.profiles(),
    )
    try:
        return _train(ctx, cfg)
    except RuntimeError as exc:
        # A peer that died or hung surfaces as a backend RuntimeError on the
        # survivors: report it in one line (the failing rank reports its own cause).
        raise as_distributed_error(exc, ctx.global_step) from None
    finally:
        ctx.close()


def _train(ctx: Context, cfg: JobConfig) -> dict[str, Any] | None:
    info = model_info(cfg.model)
    image_size = cfg.image_size or info.default_image_size
    dataset = build_dataset(
        cfg.dataset,
        image_size=image_size,
        num_classes=cfg.num_classes,
        num_samples=cfg.num_samples,
        data_dir=cfg.data_dir,
        seed=cfg.seed,
    )
    raw = info.build(cfg.num_classes, image_size)
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    raw = raw.to(memory_format=memory_format)
    model = ctx.wrap(raw, sync_batchnorm=cfg.sync_batchnorm)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    loader = ctx.loader(dataset, cfg.global_batch, seed=cfg.seed, num_workers=cfg.num_workers)
    loss_fn = nn.CrossEntropyLoss()
    if cfg.resume:
        path = Path(cfg.resume) if cfg.resume != "auto" else cfg.checkpoint_path
        if path is None:
            raise ConfigError("--resume auto needs --checkpoint-dir or --output-dir")
        load_checkpoint(path, ctx, model, optimizer)
        if ctx.rank == 0 and not cfg.quiet:
            print(f"resumed from {path} at step {ctx.global_step}", flush=True)
    start_step = ctx.global_step
    if ctx.rank == 0 and not cfg.quiet:
        emu = f", EMULATED slowdown {format_slowdowns(ctx.slowdowns)}" if ctx.emulated else ""
        print(
            f"hetero-train: {cfg.model} on {cfg.dataset}, {ctx.world_size} rank(s) "
            f"[{ctx.backend}/{ctx.device.type}], global batch {cfg.global_batch}, policy "
            f"{cfg.policy}, rebalance every {cfg.rebalance_interval} steps{emu}",
            file=sys.stdout,
            flush=True,
        )
    t0 = time.perf_counter()
    model.train()
    while ctx.global_step < cfg.steps:
        for x, y in loader:
            with autocast(ctx.device, cfg.amp):
                loss = loss_fn(model(x.contiguous(memory_format=memory_format)), y)
            ctx.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ctx.step()
            if ctx.global_step % cfg.rebalance_interval == 0:
                _progress(ctx, cfg, t0)
            if cfg.checkpoint_interval and ctx.global_step % cfg.checkpoint_interval == 0:
                assert cfg.checkpoint_path is not None
                save_checkpoint(cfg.checkpoint_path, ctx, model, optimizer)
            if ctx.global_step >= cfg.steps:
                break
    train_wall_s = time.perf_counter() - t0
    if cfg.checkpoint_path and cfg.checkpoint_interval:
        save_checkpoint(cfg.checkpoint_path, ctx, model, optimizer)

    final_plan = ctx.plan
    standalone: list[float] = []
    side_by_side: list[float] = []
    if cfg.ideal_steps > 0:

        def fresh_copy() -> nn.Module:
            m = info.build(cfg.num_classes, image_size).to(ctx.device)
            m = m.to(memory_format=memory_format)
            m.load_state_dict(raw.state_dict())
            return m

        standalone = measure_standalone(
            ctx,
            fresh_copy,
            optimizer,
            dataset,
            loss_fn,
            final_plan,
            steps=cfg.ideal_steps,
            seed=cfg.seed,
            amp=cfg.amp,
            memory_format=memory_format,
        )
        if ctx.device.type == "cpu" and ctx.world_size > 1:
            side_by_side = measure_standalone(
                ctx,
                fresh_copy,
                optimizer,
                dataset,
                loss_fn,
                final_plan,
                steps=cfg.ideal_steps,
                seed=cfg.seed,
                concurrent=True,
                amp=cfg.amp,
                memory_format=memory_format,
            )
    if ctx.rank != 0:
        return None
    return summarize(ctx, cfg, start_step, train_wall_s, final_plan, standalone, side_by_side)


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
    ideal = sum(standalone) if standalone else None
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
        "amp": cfg.amp,
        "channels_last": cfg.channels_last,
        "throughput_samples_per_s": overall,
        "steady_samples_per_s": steady,
        "train_wall_s": train_wall_s,
        "final_plan": list(final_plan),
        "plan_changes": len(ctx.plans) - 1,
        "plans": [asdict(p) | {"batches": list(p.batches)} for p in ctx.plans],
        "per_rank_compute_s": [r.compute_s for r in last],
        "per_rank_per_sample_ms": [r.compute_s / r.batch * 1e3 if r.batch else None for r in last],
        "emulated": ctx.emulated,
        "emulated_slowdown": format_slowdowns(ctx.slowdowns) or None,
        "ideal_samples_per_s": ideal,
        "ideal_method": (
            f"sum over ranks of each rank's standalone throughput at its final planned batch, "
            f"measured one rank at a time after training ({cfg.ideal_steps} steps each, median)"
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
        # Under an agent: rank 0's seconds spent asking for plans (None when embedded).
        "control_plane": ctx.planner.stats() if isinstance(ctx.planner, AgentPlanner) else None,
    }
