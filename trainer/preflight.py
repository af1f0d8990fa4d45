"""What a job's options say is wrong before any rank starts: one line, once.

``hetero-train --nproc N`` runs :func:`check` in the launcher, so a mistake that
every rank would find alike (a global batch smaller than its ranks, a data
directory that is not there) is printed once, not once per rank and again by the
launcher; ``hetero-train --dry-run`` runs it and stops; each rank runs it too
(under torchrun or an agent no launcher did). Standard library and the
catalogue only: the launcher decides this without importing torch.

The balancer's constraints (``max_batch`` caps that cannot hold the global
batch) are checked here too. What needs the files read (a CIFAR batch that does not unpickle, a text file
shorter than one sample) is found when the dataset is built: ``--dry-run``
builds it, the launcher does not.
"""

from __future__ import annotations

import os
from pathlib import Path

from hetero.core import catalogue
from hetero.core.balancer import Constraints
from hetero.core.catalogue import TrainingOptions
from hetero.core.catalogue.rules import pipeline_model
from hetero.core.errors import ConfigError, PlanError
from hetero.core.slowdown import parse_slowdowns
from hetero.trainer import safefile


def check(cfg: TrainingOptions, world_size: int) -> None:
    """Raise a ``ConfigError`` (one line, flags as ``hetero-train`` spells them) for the
    first mistake in ``cfg`` for a job of ``world_size`` ranks."""
    check_data_dir(cfg)
    check_write_dirs(cfg)
    global_batch = cfg.global_batch_for(world_size)
    if cfg.pipeline > 1:
        _pipeline_fits(cfg, world_size, global_batch)
    least = cfg.min_batch * world_size
    if global_batch < least and cfg.pipeline == 1:
        given = "--global-batch" if cfg.global_batch is not None else "the global batch"
        raise ConfigError(too_small(given, global_batch, world_size, cfg.min_batch))
    if cfg.max_batch:
        _caps_hold(cfg.max_batch, global_batch, world_size, cfg.min_batch)
    beyond = sorted(r for r in parse_slowdowns(cfg.emulate_slowdown) if r >= world_size)
    if beyond:
        raise ConfigError(f"--emulate-slowdown names rank {beyond[0]} of a {world_size}-rank job")


def _pipeline_fits(cfg: TrainingOptions, world_size: int, global_batch: int) -> None:
    """``--pipeline N``: a language model, ``N`` stages dividing the ranks, and a global batch
    of at least a sample for each replica."""
    pipeline_model(cfg)
    if world_size % cfg.pipeline:
        raise ConfigError(
            f"--pipeline {cfg.pipeline} does not divide {world_size} ranks: each pipeline "
            f"replica needs all {cfg.pipeline} stages"
        )
    replicas = world_size // cfg.pipeline
    if global_batch < replicas:
        raise ConfigError(
            f"the global batch {global_batch} is smaller than {replicas} pipeline replicas"
        )


def too_small(given: str, global_batch: int, world_size: int, min_batch: int) -> str:
    """The one line for a global batch that cannot give each rank ``min_batch`` samples
    (``given``: how the caller spells it, ``--global-batch`` or ``ctx.loader:
    global_batch``): both numbers, and the least that fits."""
    least = min_batch * world_size
    return (
        f"{given} {global_batch} is smaller than {world_size} ranks x min_batch {min_batch}: "
        f"give at least {least}"
    )


def _caps_hold(text: str, global_batch: int, world_size: int, min_batch: int) -> None:
    """``--max-batch``: a cap for every rank (or one for all), none below ``min_batch``, and
    together room for the global batch: the balancer's own constraints, checked early."""
    caps = tuple(None if p == "-" else int(p) for p in text.split(","))
    caps = caps * world_size if len(caps) == 1 else caps
    if len(caps) != world_size:
        raise ConfigError(f"--max-batch has {len(caps)} caps for {world_size} ranks")
    try:
        Constraints(global_batch, world_size, min_batch, caps)
    except PlanError as exc:
        raise ConfigError(f"--max-batch {text}: {exc}") from None


def check_write_dirs(cfg: TrainingOptions) -> None:
    """``--checkpoint-dir`` and ``--output-dir``, where they exist already, are directories
    the trainer may write into (``safefile``: its user's, writable by no one else). Found
    here, before a rank forms its group, the refusal is one line: found by a rank at its
    first checkpoint, the process exited with Gloo's threads running and C++ aborted
    ("terminate called without an active exception") after the line."""
    for path in (cfg.checkpoint_dir, cfg.output_dir):
        if path is not None and os.path.lexists(path):
            with safefile.open_dir(path, create=False):
                pass


def check_data_dir(cfg: TrainingOptions) -> None:
    """A dataset that reads ``--data-dir`` has one, and it exists and is readable."""
    entry = catalogue.dataset(cfg.dataset or catalogue.default_dataset(cfg.model))
    if not entry.needs_data_dir:
        return
    if cfg.data_dir is None:
        raise ConfigError(f"--dataset {entry.name} needs --data-dir")
    path = Path(cfg.data_dir)
    if not path.exists():
        raise ConfigError(f"--data-dir {str(path)!r} does not exist (--dataset {entry.name})")
    # A directory is listed (r) and entered (x); a file (the text dataset's) is read.
    mode = os.R_OK | os.X_OK if path.is_dir() else os.R_OK
    if not os.access(path, mode):
        raise ConfigError(f"--data-dir {str(path)!r} is not readable by this user")
