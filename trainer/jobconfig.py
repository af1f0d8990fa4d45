"""A built-in job's configuration: the catalogue's ``TrainingOptions``, and what the trainer
derives from it once torch and the world are at hand.

``JobConfig`` *is* ``hetero.core.catalogue.TrainingOptions``: ``hetero-train``,
job.yaml (through an agent) and ``ht.train`` all build the same validated
value. What needs torch or a file — the memory layout, the ranks' profiles —
is resolved here (per-rank caps and memory fractions in ``trainer.memory`` and
``trainer.simulate``), and a bad value is an ``OptionError`` naming the option,
which the entry point words in its caller's spelling.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from hetero.core.balancer import DeviceProfile
from hetero.core.catalogue import OptionError, TrainingOptions
from hetero.core.catalogue import model as model_entry

JobConfig = TrainingOptions


def memory_format(cfg: JobConfig) -> torch.memory_format:
    """``channels_last`` where it applies (convolutional image models), else contiguous."""
    applies = model_entry(cfg.model).channels_last_applies
    return torch.channels_last if cfg.channels_last and applies else torch.contiguous_format


def checkpoint_path(cfg: JobConfig) -> Path | None:
    file = cfg.checkpoint_file
    return Path(file) if file else None


#: The options that define what a run trains: a checkpoint resumes only under the same
#: values. Left out on purpose: what may change between a run and its resumption
#: (length, ranks, devices, balancing, output, memory tuning), and ``name``, which a
#: job's restarts keep anyway.
IDENTITY_OPTIONS = (
    "model",
    "dataset",
    "data_dir",
    "num_samples",
    "num_classes",
    "image_size",
    "seq_len",
    "global_batch",
    "batch_size",
    "lr",
    "optimizer",
    "seed",
    "zero",
)


def spec_hash(cfg: JobConfig) -> str:
    """Hex SHA-256 of :data:`IDENTITY_OPTIONS` as canonical JSON: a checkpoint's spec hash."""
    values = {name: getattr(cfg, name) for name in IDENTITY_OPTIONS}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def profiles(cfg: JobConfig) -> list[DeviceProfile] | None:
    """Per-rank relative speeds for ``proportional``/``hybrid``: ``compute_scores``, or the
    ``gpu_profiles`` file; None without either. One entry per rank (``Context`` checks)."""
    if cfg.gpu_profiles is not None:
        return read_gpu_profiles(cfg.gpu_profiles)
    if cfg.compute_scores is not None:
        scores = [float(x) for x in cfg.compute_scores.split(",")]
        return [DeviceProfile(f"rank{r}", x) for r, x in enumerate(scores)]
    return None


def read_gpu_profiles(path: str) -> list[DeviceProfile]:
    """``--gpu-profiles FILE.json``: a JSON list, in rank order, of objects
    ``{"name": str, "compute_score": number > 0, "memory_bytes": int >= 0}``
    (``name`` and ``memory_bytes`` optional), e.g. each GPU's measured solo samples/s.
    Also accepted: ``{"ranks": [...]}``."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise OptionError("gpu_profiles", f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise OptionError("gpu_profiles", f"{path} is not JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("ranks"), list):
        data = data["ranks"]
    if not isinstance(data, list) or not data:
        raise OptionError("gpu_profiles", f"{path}: expected a non-empty list of profiles")
    return [_profile(path, r, item) for r, item in enumerate(data)]


def _profile(path: str, rank: int, item: Any) -> DeviceProfile:
    where = f"{path}: entry {rank}"
    if not isinstance(item, dict):
        raise OptionError("gpu_profiles", f"{where}: expected an object with compute_score")
    unknown = set(item) - {"name", "compute_score", "memory_bytes"}
    if unknown:
        raise OptionError("gpu_profiles", f"{where}: unknown field {sorted(unknown)[0]!r}")
    score = item.get("compute_score")
    if isinstance(score, bool) or not isinstance(score, int | float) or not score > 0:
        raise OptionError("gpu_profiles", f"{where}: compute_score must be a number > 0")
    memory = item.get("memory_bytes")
    if memory is not None and (
        isinstance(memory, bool) or not isinstance(memory, int) or memory < 0
    ):
        raise OptionError("gpu_profiles", f"{where}: memory_bytes must be a whole number >= 0")
    name = item.get("name", f"rank{rank}")
    if not isinstance(name, str):
        raise OptionError("gpu_profiles", f"{where}: name must be a string")
    return DeviceProfile(name, float(score), memory)
