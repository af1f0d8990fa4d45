"""Checkpoints that hold everything needed to resume exactly.

One file per checkpoint, written by rank 0 atomically (temporary file, then
rename), holding: model and optimizer state, the loader position and plan
schedule, the plan history the balancer fits, the step, and every rank's RNG
states. Resuming continues the same data order under the same plans, so the
losses match an uninterrupted run.

A checkpoint also resumes with another number of ranks (a job restarted on the
devices left after a node was lost). The data order is global — one seeded
permutation per epoch, each step the next ``B`` samples — and the global batch
does not change, so every step trains on the same samples with the same exact
gradient; only the cut between ranks differs. What was per rank is then not
restored: the plan (the run's initial plan for its ranks applies from the
resumed step, and the balancer re-fits from fresh intervals), the balancer's
history, and the RNG state of ranks beyond the checkpoint's world size (they
keep the state the run seeded them with; ranks below it get their own saved
state). One caveat: when the dataset size is not a multiple of the global
batch, whether an epoch ends with a short step depends on ``min_batch`` times
the world size, so such an epoch may have one step more or less.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero.core.balancer import RankInterval
from hetero.core.errors import CheckpointError
from hetero.trainer.context import Context
from hetero.trainer.rebalance import PlanRecord

FORMAT = "hetero-checkpoint-v1"


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def save_checkpoint(
    path: str | Path,
    ctx: Context,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Collective: every rank calls it; rank 0 writes ``path``. Returns the path."""
    path = Path(path)
    rng = [_rng_state()]
    if ctx.world_size > 1:
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    if ctx.rank == 0:
        loader = ctx._require_loader()
        state = {
            "format": FORMAT,
            "world_size": ctx.world_size,
            "global_step": ctx.global_step,
            "model": _unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "loader": loader.state_dict(),
            "plans": [vars(p) for p in ctx.plans],
            "history": [[vars(r) for r in interval] for interval in ctx.history],
            "rng": rng,
            "extra": extra or {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        try:
            torch.save(state, tmp)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise CheckpointError(
                f"cannot write checkpoint {path}: {exc.strerror or exc}"
            ) from None
    ctx.barrier()
    ctx.clock.restart()
    return path


def load_checkpoint(
    path: str | Path,
    ctx: Context,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint on every rank; returns its ``extra`` dict."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file: name it, don't trace back
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a hetero checkpoint")
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    loader = ctx._require_loader()
    same_world = state["world_size"] == ctx.world_size
    loader.load_state_dict(state["loader"], plans=same_world)
    ctx.global_step = int(state["global_step"])
    ctx.stats_from_step = ctx.global_step + ctx.config.warmup_steps
    ctx.history.clear()
    if same_world:
        ctx.plans = [
            PlanRecord(p["version"], p["apply_at_step"], tuple(p["batches"]), p["reason"])
            for p in state["plans"]
        ]
        for interval in state["history"]:
            ctx.history.append(tuple(RankInterval(**r) for r in interval))
    else:
        first = ctx.plans[0]
        reason = f"{first.reason}; resumed from a {state['world_size']}-rank checkpoint"
        ctx.plans = [PlanRecord(first.version, ctx.global_step, first.batches, reason)]
    if ctx.rank < len(state["rng"]):
        _set_rng_state(state["rng"][ctx.rank])
    ctx.clock.restart()
    extra: dict[str, Any] = state["extra"]
    return extra
