"""A built-in training job, written with the same public API a user's loop uses.

``run_job`` runs inside every rank: it builds the model and dataset
(``trainer.build``), trains for the job's steps — or its epochs, counted from
the dataset's real size — under the chosen policy, checkpoints, measures each
rank alone for the ideal throughput, and (on rank 0) returns the summary
(``trainer.report``). ``ht.train(**options)`` is the same job from Python.
Over the usual ~450 lines as ruff formats it: the job's steps read in order, each
handing its work to the module named in it, for data parallelism and pipeline stages
alike (``trainer.pipeline``: the stages' step, their re-cut at a checkpoint).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hetero.core.catalogue.keywords import from_keywords
from hetero.core.errors import DistributedError, HeteroError, Stopped
from hetero.core.gap import Solo
from hetero.core.rankenv import RankEnv
from hetero.core.slowdown import format_slowdowns
from hetero.trainer import preflight, report
from hetero.trainer.activations import probe_choosing
from hetero.trainer.build import Built, build, local_optimizer, make_optimizer
from hetero.trainer.checkpoint import RunIdentity, load_checkpoint, save_checkpoint
from hetero.trainer.context import Context, HeteroLoader
from hetero.trainer.evaluation import finite_numbers
from hetero.trainer.ideal import measure_solo
from hetero.trainer.jobconfig import (
    JobConfig,
    checkpoint_path,
    memory_format,
    profiles,
    spec_hash,
)
from hetero.trainer.memory import MemoryMonitor, describe, parse_max_batch
from hetero.trainer.memprobe import ProbeResult
from hetero.trainer.models.recompute import recomputing, set_recompute
from hetero.trainer.oom import OomGuard
from hetero.trainer.pipeline.wrap import pipeline_figures
from hetero.trainer.precision import Autocast, autocast, grad_scaler
from hetero.trainer.runsummary import gap_fields
from hetero.trainer.sharding import full_weights
from hetero.trainer.simulate import apply_memory_fraction, parse_fractions
from hetero.trainer.start import init

__all__ = ["JobConfig", "as_distributed_error", "run_job", "train"]


def train(**options: Any) -> dict[str, Any] | None:
    """Run a built-in job in this process (one rank of the job its environment describes,
    or alone): ``ht.train(model="resnet50", amp="bf16", epochs=2)``. The keywords are
    ``hetero-train``'s options by name; returns the summary on rank 0, ``None`` elsewhere."""
    return run_job(from_keywords(options))


_PEER_FAILURE = ("Connection closed by peer", "Connection reset by peer", "timed out", "Timeout")


def as_distributed_error(exc: RuntimeError, step: int) -> Exception:
    """A backend failure caused by a peer as a one-line ``DistributedError``; others unchanged."""
    text = str(exc)
    if isinstance(exc, torch.distributed.DistBackendError) or any(p in text for p in _PEER_FAILURE):
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return DistributedError(f"lost a peer at step {step}: {first[:200]}")
    return exc


def run_job(cfg: JobConfig) -> dict[str, Any] | None:
    """Train; return the summary on rank 0 (``None`` elsewhere)."""
    # Before the group forms: under torchrun or an agent no launcher checked this.
    preflight.check(cfg, RankEnv.from_env().world_size)
    torch.manual_seed(cfg.seed)
    ctx = init(
        cfg.policy,
        rebalance_interval=cfg.rebalance_interval,
        min_batch=cfg.min_batch,
        emulate_slowdown=cfg.emulate_slowdown,
        output_dir=cfg.run_dir,
        device=cfg.device,
        # Simulated nodes share one GPU, which NCCL refuses; Gloo moves CUDA tensors.
        backend=cfg.backend or ("gloo" if cfg.simulate_nodes else None),
        warmup_steps=cfg.warmup_steps,
        settle_steps=cfg.settle_steps,
        history_intervals=cfg.history_intervals,
        collective_timeout_s=cfg.collective_timeout_s,
        comm=cfg.comm,
        shard=cfg.shard,
        offload=cfg.offload,
        activation_checkpointing=cfg.activation_checkpointing,
        tensorboard=cfg.tensorboard,
        profiles=profiles(cfg),
    )
    ctx.total_steps = cfg.steps
    failed = True
    try:
        result = _train(ctx, cfg)
        failed = False
        return result
    except torch.OutOfMemoryError:
        raise HeteroError(
            f"out of memory at step {ctx.global_step} (batch {_my_batch(ctx)}); retry such steps "
            f"with oom_retry, or cap batches with max_batch"
        ) from None
    except RuntimeError as exc:
        # A peer that died or hung surfaces as a backend RuntimeError on the
        # survivors: report it in one line (the failing rank reports its own cause).
        raise as_distributed_error(exc, ctx.global_step) from None
    finally:
        ctx.close(failed=failed)


def _my_batch(ctx: Context) -> int | str:
    sizes = ctx._step_sizes
    return sizes[ctx.rank] if sizes else "?"


@dataclass
class _Run:
    """One rank's training: its parts, built once, and what the loop needs per step."""

    ctx: Context
    cfg: JobConfig
    built: Built
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: HeteroLoader
    layout: torch.memory_format
    scaler: Any
    monitor: MemoryMonitor
    guard: OomGuard | None
    #: What the start-up memory probe found (None: not run, or nothing measurable).
    probe: ProbeResult | None = None
    #: Samples each evaluation scores (``eval_samples``, else proportionate to the run).
    eval_samples: int = 0
    #: The whole model's parameters (a pipeline stage holds some of them).
    parameters: int = 0
    #: Seconds the last checkpoint took to write.
    checkpoint_s: float = 0.0
    #: A pipeline's re-cuts (``recut``).
    moves: list[Any] = field(default_factory=list)

    @property
    def zero(self) -> bool:
        return self.optimizer is not local_optimizer(self.optimizer)

    def loss(self, batch: Any) -> torch.Tensor:
        """Forward and the mean loss of ``batch``."""
        x, y = batch
        if self.layout is not torch.contiguous_format:
            x = x.contiguous(memory_format=self.layout)
        with autocast(self.ctx.device, self.cfg.amp):
            return self.built.task.loss(self.model(x), y)

    def compute(self, batch: Any) -> torch.Tensor | None:
        """Forward, loss and backward on this rank's share of the step (a pipeline stage's:
        its replica's share, the loss on the last stage alone)."""
        if self.ctx.pipeline is not None:
            return self.ctx.pipeline.step(*batch)
        return self.data_parallel(batch)

    def data_parallel(self, batch: Any) -> torch.Tensor:
        """Forward, loss and backward of data parallelism alone."""
        loss = self.loss(batch)
        self.ctx.backward(self.scaler.scale(loss) if self.scaler is not None else loss)
        return loss

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def checkpoint(self) -> Path:
        path = checkpoint_path(self.cfg)
        assert path is not None  # the catalogue's rules: an interval needs a directory
        if self.zero:
            self.optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
        identity = RunIdentity.of(self.ctx, spec_hash(self.cfg))
        started = time.perf_counter()
        written = save_checkpoint(path, self.ctx, self.model, self.optimizer, identity=identity)
        self.checkpoint_s = time.perf_counter() - started
        return written

    def recut(self, total_steps: int) -> None:
        """After a pipeline's checkpoint: its stages re-cut if that pays (``recut``)."""
        from hetero.trainer.pipeline.recut import at_checkpoint

        ctx, cfg = self.ctx, self.cfg
        moved = at_checkpoint(
            ctx,
            cfg,
            self.built.fresh,
            lambda m: make_optimizer(cfg, m, ctx.world_size),
            total_steps=total_steps,
            checkpoint_s=self.checkpoint_s,
        )
        if moved is not None:
            self.model, self.optimizer, move = moved
            self.moves.append(move)

    def stop(self, checkpointed: bool) -> Stopped:
        """The ranks agreed to stop on SIGTERM after this step: checkpoint it (unless the
        periodic checkpoint just did) and say so in one line."""
        path = checkpoint_path(self.cfg)
        if not checkpointed:
            path = self.checkpoint()
        stopped = Stopped(
            f"stopping at step {self.ctx.global_step} on SIGTERM: checkpoint written to {path}"
        )
        if self.ctx.rank == 0:
            print(f"hetero-train: {stopped}", file=sys.stderr, flush=True)
        return stopped


def _setup(ctx: Context, cfg: JobConfig) -> tuple[_Run, float | None]:
    fraction = apply_memory_fraction(ctx, parse_fractions(cfg.memory_fraction, ctx.world_size))
    if fraction is None and cfg.memory_fraction and ctx.rank == 0:
        print("hetero-train: --memory-fraction ignored on CPU ranks (CUDA only)", file=sys.stderr)
    caps = parse_max_batch(cfg.max_batch, ctx.world_size)
    if caps is not None:
        ctx.set_max_batch(caps)
    built = build(cfg)
    parameters = sum(p.numel() for p in built.model.parameters())
    layout = memory_format(cfg)
    built.model = built.model.to(memory_format=layout)
    # Sharded in bf16: gather and compute in bf16, keep the shards and the reduction in fp32.
    param_dtype = torch.bfloat16 if cfg.amp == "bf16" and cfg.shard != "none" else None
    if cfg.pipeline > 1:  # this rank's stage (the catalogue's rules: a language model)
        model = ctx.wrap(built.model, pipeline=cfg.pipeline, loss_fn=built.task.loss)
    else:
        model = ctx.wrap(built.model, sync_batchnorm=cfg.sync_batchnorm, param_dtype=param_dtype)
    optimizer = make_optimizer(cfg, model, ctx.world_size)
    global_batch = cfg.global_batch_for(ctx.world_size)
    loader = ctx.loader(built.dataset, global_batch, seed=cfg.seed, num_workers=cfg.num_workers)
    assert isinstance(loader, HeteroLoader)  # the built-in datasets are map-style
    if cfg.resume:
        _resume(ctx, cfg, model, optimizer)
    # Memory caps and the probe size ranks' batches; a pipeline's shares are whole
    # microbatches, each sized when the stages were cut to fit (``core.stages``).
    pipelined = ctx.pipeline is not None
    monitor = MemoryMonitor(
        ctx,
        margin=cfg.memory_margin,
        configured=caps,
        fraction=fraction,
        measure=cfg.memory_caps and not pipelined,
    )
    guard = OomGuard(ctx, model, monitor) if cfg.oom_retry else None
    run = _Run(
        ctx,
        cfg,
        built,
        model,
        optimizer,
        loader,
        layout,
        grad_scaler(ctx.device, cfg.amp),
        monitor,
        guard,
        parameters=parameters,
    )
    if cfg.memory_probe and cfg.memory_caps and not pipelined:
        # Before the first step: the first plan must already fit every rank's memory.
        # Under activation_checkpointing auto it also decides which ranks recompute.
        run.probe = probe_choosing(
            ctx,
            model,
            optimizer,
            loader.samples,
            run.loss,
            margin=cfg.memory_margin,
            fraction=fraction,
            share=loader.sampler.global_batch // ctx.world_size,
        )
        if run.probe is not None:
            monitor.start_from(run.probe.caps, run.probe.step_points(ctx.rank))
    return run, fraction


def _resume(ctx: Context, cfg: JobConfig, model: nn.Module, optimizer: Any) -> None:
    path = checkpoint_path(cfg) if cfg.resume == "auto" else Path(str(cfg.resume))
    assert path is not None  # the catalogue's rules: resume auto needs a directory
    if cfg.resume == "auto" and not path.is_file():
        # A restarted job that failed before its first checkpoint starts over.
        if ctx.rank == 0 and not cfg.quiet:
            print(f"no checkpoint at {path} yet: starting from step 0", flush=True)
        return
    load_checkpoint(path, ctx, model, optimizer, identity=RunIdentity.of(ctx, spec_hash(cfg)))
    if ctx.rank == 0 and not cfg.quiet:
        print(f"resumed from {path} at step {ctx.global_step}", flush=True)


def _announce(run: _Run, total_steps: int) -> None:
    ctx, cfg = run.ctx, run.cfg
    if ctx.rank != 0 or cfg.quiet:
        return
    emu = f", EMULATED slowdown {format_slowdowns(ctx.slowdowns)}" if ctx.emulated else ""
    sim = f", SIMULATED {cfg.simulate_nodes} nodes on one device" if cfg.simulate_nodes else ""
    probed = f", memory probe caps {describe(run.probe.caps)}" if run.probe is not None else ""
    if ctx.pipeline is not None:
        probed += f", {ctx.pipeline.describe()}"
    length = f"{cfg.epochs} epochs = {total_steps} steps" if cfg.epochs else f"{total_steps} steps"
    print(
        f"hetero-train: {cfg.model} ({run.built.task.name}) on {cfg.dataset}, {ctx.world_size} "
        f"rank(s) [{ctx.backend}/{ctx.device.type}], global batch "
        f"{cfg.global_batch_for(ctx.world_size)}, {length}, policy {cfg.policy}, rebalance "
        f"every {cfg.rebalance_interval} steps{probed}{emu}{sim}",
        flush=True,
    )


def _train(ctx: Context, cfg: JobConfig) -> dict[str, Any] | None:
    run, fraction = _setup(ctx, cfg)
    steps_per_epoch = run.loader.sampler.steps_per_epoch
    total_steps = cfg.steps_for(steps_per_epoch)  # epochs: from the dataset's real size
    run.eval_samples = cfg.eval_samples_for(total_steps * cfg.global_batch_for(ctx.world_size))
    start_step = ctx.global_step
    _announce(run, total_steps)

    t0 = time.perf_counter()
    run.model.train()
    if checkpoint_path(cfg) is not None and cfg.checkpoint_every:
        ctx.stop_on_sigterm()  # SIGTERM: finish the step, checkpoint it, exit 143
    while ctx.global_step < total_steps:
        for batch in run.loader:
            loss: torch.Tensor | None
            if run.guard is not None:
                batch, loss = run.guard.run(batch, run.data_parallel)
            else:
                loss = run.compute(batch)
            run.optimizer_step()
            ctx.step(loss)
            run.monitor.after_step(int(batch[0].shape[0]))
            if cfg.eval_every and ctx.global_step % cfg.eval_every == 0:
                ctx.evaluate(lambda: _evaluate_now(run))
            if ctx.global_step % cfg.rebalance_interval == 0 or ctx.global_step >= total_steps:
                report.progress(ctx, cfg, total_steps, t0)
            periodic = bool(cfg.checkpoint_every) and ctx.global_step % cfg.checkpoint_every == 0
            if periodic:
                run.checkpoint()
                if ctx.pipeline is not None and ctx.global_step < total_steps:
                    run.recut(total_steps)
            if ctx.stopping:
                raise run.stop(checkpointed=periodic)
            if ctx.global_step >= total_steps:
                break
    train_wall_s = time.perf_counter() - t0
    if checkpoint_path(cfg) and cfg.checkpoint_every:
        run.checkpoint()
    ctx.stop_on_sigterm(False)  # from here a SIGTERM ends the rank at once, as before
    return _finish(run, start_step, train_wall_s, fraction, steps_per_epoch)


#: The evaluation's figures that become curves (its sample count and split do not).
_CURVES = ("eval_loss", "eval_accuracy")


def _eval_model(run: _Run) -> nn.Module:
    """The model rank 0 scores. Sharded, an unsharded copy: gathering the weights is
    collective, so every rank calls this."""
    if run.ctx.shard == "none":
        return run.built.model
    raw = run.built.fresh().to(run.ctx.device)
    raw.load_state_dict(full_weights(run.model))
    return raw


def _evaluate_now(run: _Run) -> dict[str, Any]:
    """Rank 0 scores ``run.eval_samples`` samples at its own batch (the other ranks wait)."""
    ctx = run.ctx
    model = _eval_model(run)
    if ctx.rank != 0:
        return {}
    result = report.evaluate_rank0(
        ctx,
        run.cfg,
        run.built.task,
        model,
        run.built.dataset,
        ctx.running_plan[0],
        samples=run.eval_samples,
    )
    return {k.removeprefix("eval_"): v for k, v in result.items() if k in _CURVES}


def _ideal(run: _Run, steps: int) -> tuple[list[Solo], list[float]]:
    """Each rank alone at the batch it ran last for ``steps`` steps (and, on a shared CPU
    host, all at once)."""
    ctx, cfg, built = run.ctx, run.cfg, run.built
    solos: list[Solo] = []
    side_by_side: list[float] = []
    if steps <= 0 or ctx.pipeline is not None:  # a stage alone trains nothing
        return solos, side_by_side

    report.measuring_ideal(ctx, cfg, steps)
    weights = full_weights(run.model) if ctx.shard != "none" else built.model.state_dict()

    def fresh_copy() -> nn.Module:
        m = built.fresh().to(ctx.device).to(memory_format=run.layout)
        m.load_state_dict(weights)
        set_recompute(m, recomputing(run.model))  # alone as in the job: its speed, its memory
        return Autocast(m, ctx.device, cfg.amp) if cfg.amp != "none" else m

    # The same on every rank (a collective): Gloo jobs share a host CPU somewhere.
    shared_host = ctx.backend == "gloo" and ctx.world_size > 1
    for concurrent in (False, True) if shared_host else (False,):
        measured = measure_solo(
            ctx,
            fresh_copy,
            local_optimizer(run.optimizer),
            built.dataset,
            built.task.loss,
            ctx.running_plan,  # a plan scheduled at the last boundary never ran
            steps=steps,
            seed=cfg.seed,
            concurrent=concurrent,
            memory_format=run.layout,
        )
        if concurrent:
            side_by_side.extend(s.samples_per_s for s in measured)
        else:
            solos = measured
    return solos, side_by_side


def _finish(
    run: _Run, start_step: int, train_wall_s: float, fraction: float | None, steps_per_epoch: int
) -> dict[str, Any] | None:
    ctx, cfg, built = run.ctx, run.cfg, run.built
    evaluation: dict[str, Any] = {}
    if run.eval_samples:
        # Sharded, rank 0 scores an unsharded copy (gathering the weights is collective).
        raw = _eval_model(run)
        if ctx.rank == 0:
            # Rank 0's own batch: it trained at that size, so it fits its memory (cap).
            evaluation = report.evaluate_rank0(
                ctx,
                cfg,
                built.task,
                raw,
                built.dataset,
                ctx.plan[ctx.rank],
                samples=run.eval_samples,
            )
            # The curve's last point (hetero-top --run), beside the summary's figures.
            metrics = finite_numbers(
                {k.removeprefix("eval_"): v for k, v in evaluation.items() if k in _CURVES}
            )
            ctx.metrics.write_eval(
                {"step": ctx.global_step, "time_s": time.time(), "metrics": metrics}
            )
    final_plan = ctx.plan
    stages = pipeline_figures(ctx) if ctx.pipeline is not None else None  # collective
    solos, side_by_side = _ideal(run, report.ideal_steps(cfg, ctx.global_step - start_step))
    if ctx.rank != 0:
        return None
    standalone = [s.samples_per_s for s in solos]
    summary = report.summarize(
        ctx, cfg, start_step, train_wall_s, final_plan, standalone, side_by_side
    )
    summary.update(evaluation)
    summary.update(gap_fields(ctx, solos, summary["steady_samples_per_s"]))
    global_batch = cfg.global_batch_for(ctx.world_size)
    samples_per_epoch = len(built.dataset)
    summary.update(
        task=built.task.name,
        seq_len=built.size if built.task.text else None,
        amp=cfg.amp,
        zero=run.zero,
        shard=ctx.shard,
        offload=cfg.offload,
        activation_checkpointing=cfg.activation_checkpointing,
        optimizer=type(local_optimizer(run.optimizer)).__name__,
        parameters=run.parameters,
        pipeline=stages | {"recuts": [vars(m) for m in run.moves]} if stages is not None else None,
        memory_caps=list(run.monitor.caps) if run.monitor.caps else None,
        memory_caps_text=describe(run.monitor.caps),
        memory_probe=run.probe.as_dicts() if run.probe is not None else None,
        per_rank_peak_memory_bytes=[
            max(iv[r].peak_memory_bytes for iv in ctx.summaries) for r in range(ctx.dp_size)
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
            for e in (run.guard.events if run.guard is not None else [])
        ],
        simulated_nodes=cfg.simulate_nodes or None,
        memory_fraction=parse_fractions(cfg.memory_fraction, ctx.world_size),
        samples_per_epoch=samples_per_epoch,
        steps_per_epoch=steps_per_epoch,
        epochs=ctx.global_step / steps_per_epoch if steps_per_epoch else None,
        epochs_requested=cfg.epochs,
        time_per_epoch_s=train_wall_s
        * samples_per_epoch
        / max((ctx.global_step - start_step) * global_batch, 1),
    )
    return summary
