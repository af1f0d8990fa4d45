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

**A checkpoint cannot run code.** It is read with ``torch.load(weights_only=True)``:
tensors, numbers, strings, lists, tuples and dicts only, so a file planted in
``checkpoint.dir`` that pickles a callable is refused, not executed. What we
save is plain state already (``state_dict()`` of model and optimizer, our
records as dicts); a user's ``extra`` must be plain too, checked when saving.

**Sharded runs** (``shard``, FSDP2) keep model and optimizer state in a
directory of shards beside the file, written by every rank with
``torch.distributed.checkpoint`` and named in the file (``trainer.shardstate``);
it resumes onto any number of ranks, sharded or not. A checkpoint of an
unsharded run does not resume a sharded one (its optimizer state is keyed by
parameter index, not by name): refused with one line.

**Pipeline stages** (``pipeline``) are saved the same way, every rank its stage, keyed by
the whole model's names (the optimizer's hyperparameters too): the checkpoint resumes onto
another split of the blocks, or another number of replicas, and the file records the
split it was written under (``split``). It resumes a pipelined run only.

**A checkpoint belongs to one run.** It records its :class:`RunIdentity`: the
coordinator's job id (``HETERO_JOB_ID``; none outside a coordinator) and a
spec hash, the SHA-256 of the training options that define what is trained
(``hetero.trainer.jobconfig.spec_hash``; none for a user's own loop unless it
passes one). Resuming from a checkpoint of another identity is refused with
one line, so two jobs that share a ``checkpoint.dir`` never continue each
other's training. A job's restarts keep its id and spec, so they resume.
"""

from __future__ import annotations

import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero.core.balancer import RankInterval
from hetero.core.errors import CheckpointError
from hetero.trainer.context import Context
from hetero.trainer.rebalance import PlanRecord
from hetero.trainer.safefile import ensure_dir, write_atomic
from hetero.trainer.shardstate import load_shards, remove_old_shards, save_shards, shards_dir

#: v2: read with ``weights_only=True`` and carries the run's identity. A v1 file
#: (no identity) is refused: nothing says which run wrote it.
FORMAT = "hetero-checkpoint-v2"
_OLD_FORMATS = ("hetero-checkpoint-v1",)


@dataclass(frozen=True)
class RunIdentity:
    """Which run a checkpoint belongs to. ``job_id``: the coordinator's job id, None outside
    a coordinator. ``spec_hash``: hex SHA-256 of the options that define what is trained,
    None where the caller does not give one (a user's own loop)."""

    job_id: str | None = None
    spec_hash: str | None = None

    @classmethod
    def of(cls, ctx: Context, spec_hash: str | None = None) -> RunIdentity:
        return cls(ctx.env.job_id, spec_hash)

    def describe(self) -> str:
        job = f"job {self.job_id}" if self.job_id else "a run outside a coordinator"
        return f"{job}, spec {self.spec_hash[:12]}" if self.spec_hash else job


#: The leaf types ``torch.load(weights_only=True)`` reads back.
_PLAIN = (type(None), bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.device)


def _plain_problem(value: Any, where: str) -> str | None:
    """Why ``value`` would not load under ``weights_only=True``, or None if it would."""
    if isinstance(value, _PLAIN):
        return None
    if isinstance(value, dict):
        if any(not isinstance(k, str | int) for k in value):
            return f"{where} has a key that is neither str nor int"
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(enumerate(value))
    else:
        return f"{where} (a {type(value).__name__})"
    for key, item in items:
        problem = _plain_problem(item, f"{where}[{key!r}]")
        if problem:
            return problem
    return None


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
    identity: RunIdentity | None = None,
) -> Path:
    """Collective: every rank calls it; rank 0 writes ``path``. Returns the path.

    ``extra``: plain data only (tensors, numbers, strings, lists, tuples, dicts), the
    state a checkpoint can hold without running code on load. ``identity``: the run's
    (:meth:`RunIdentity.of` the context without a spec hash by default)."""
    path = Path(path)
    identity = identity or RunIdentity.of(ctx)
    problem = _plain_problem(extra or {}, "extra")
    if problem:
        raise CheckpointError(
            f"cannot checkpoint {problem}: a checkpoint holds tensors and plain data only"
        )
    if ctx._stop is not None:
        ctx._stop.busy = True  # a long write is no stuck rank (``trainer.drain``)
    rng = [_rng_state()]
    if ctx.world_size > 1:
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    by_name = ctx.pipeline is not None
    shards = shards_dir(path, ctx.global_step) if ctx.shard != "none" or by_name else None
    if shards is not None:
        if ctx.rank == 0:
            ensure_dir(path.parent)  # the shards are written by path, by every rank
            shutil.rmtree(shards, ignore_errors=True)  # a save of this step that crashed
        ctx.barrier()
        save_shards(shards, model, optimizer, by_name=by_name)
    if ctx.rank == 0:
        loader = ctx._require_loader()
        state = {
            "format": FORMAT,
            "job_id": identity.job_id,
            "spec_hash": identity.spec_hash,
            "world_size": ctx.world_size,
            # Pipeline stages, and their split: a plan is the replicas' then.
            "pipeline": ctx.layout.stages if ctx.layout is not None else 1,
            "split": list(ctx.pipeline.pipe.bounds) if ctx.pipeline is not None else None,
            "global_step": ctx.global_step,
            "model": _unwrap(model).state_dict() if shards is None else None,
            "optimizer": optimizer.state_dict()
            if optimizer is not None and shards is None
            else None,
            "shards": shards.name if shards is not None else None,
            "loader": loader.state_dict(),
            "plans": [vars(p) for p in ctx.plans],
            "history": [[vars(r) for r in interval] for interval in ctx.history],
            "rng": rng,
            "extra": extra or {},
        }
        try:
            # A fresh temporary name in a checked directory, then a rename: a link
            # planted in ``checkpoint.dir`` is never followed (``trainer.safefile``).
            write_atomic(path, lambda fh: torch.save(state, fh))
        except OSError as exc:
            raise CheckpointError(
                f"cannot write checkpoint {path}: {exc.strerror or exc}"
            ) from None
        if shards is not None:
            remove_old_shards(path, keep=shards)
    ctx.barrier()
    ctx.clock.restart()
    if ctx._stop is not None:
        ctx._stop.busy = False
    return path


def load_checkpoint(
    path: str | Path,
    ctx: Context,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    identity: RunIdentity | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint on every rank; returns its ``extra`` dict.

    Refused (``CheckpointError``, nothing restored) when the file holds anything but
    plain state, or was written by a run of another ``identity`` (default:
    :meth:`RunIdentity.of` the context)."""
    path = Path(path)
    identity = identity or RunIdentity.of(ctx)
    state = read_checkpoint(path)
    theirs = RunIdentity(state.get("job_id"), state.get("spec_hash"))
    if theirs != identity:
        raise CheckpointError(
            f"checkpoint {path} belongs to {theirs.describe()}, not to this run "
            f"({identity.describe()}): refusing to resume from another run's checkpoint "
            "(give each job its own checkpoint.dir)"
        )
    shards = state.get("shards")
    stages = ctx.layout.stages if ctx.layout is not None else 1
    theirs_stages = int(state.get("pipeline", 1))
    if (theirs_stages > 1) != (stages > 1):
        how = f"with {theirs_stages} pipeline stages" if theirs_stages > 1 else "without stages"
        raise CheckpointError(
            f"checkpoint {path} was written {how}: resume it so (a pipeline's state is keyed "
            "by its stages' names, data parallelism's by the model's)"
        )
    if shards is not None:
        if not isinstance(shards, str) or "/" in shards or not shards.endswith(".shards"):
            raise CheckpointError(f"checkpoint {path} names no shard directory beside it")
        load_shards(path.with_name(shards), model, optimizer, by_name=stages > 1)
    elif ctx.shard != "none":
        raise CheckpointError(
            f"checkpoint {path} was written without shard: resume it with shard none"
        )
    else:
        _unwrap(model).load_state_dict(state["model"])
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])
    loader = ctx._require_loader()
    same_world = state["world_size"] == ctx.world_size and state.get("pipeline", 1) == stages
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


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's state, read without running code: ``weights_only=True`` refuses
    any pickled callable or class (the file is not trusted: anyone who can write
    ``checkpoint.dir`` can plant one)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"refusing checkpoint {path}: it holds objects other than tensors and plain "
            "data, and loading them could run code"
        ) from None
    except Exception as exc:  # a truncated or foreign file: name it, don't trace back
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read checkpoint {path}: {reason}") from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, *_OLD_FORMATS):
        raise CheckpointError(f"{path} is not a hetero checkpoint")
    if state["format"] != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} is in {state['format']}, which records no run identity: "
            "move it away to start over"
        )
    return state
