"""Model and optimizer state of a sharded run, saved and loaded with ``torch.distributed.checkpoint``.

Under ``shard`` (FSDP2) no rank holds the whole state, so ``trainer.checkpoint``
writes it with DCP: every rank writes its own shards into a directory beside
the checkpoint file (``NAME.stepN.shards``), and the file (rank 0, written
last, atomically) records that directory with the rest of the run's state. A
crash mid-save leaves the previous file pointing at the previous directory.
DCP reshards on load, so the state resumes onto any world size, and onto an
unsharded model too (``get_state_dict``/``set_state_dict`` key both by the
parameters' names).

**No code runs on load.** DCP's ``FileSystemReader`` unpickles the
directory's ``.metadata`` with plain ``pickle``; :class:`SafeReader` reads it
with an unpickler that resolves only DCP's own metadata classes and a few
harmless types, so a planted ``.metadata`` that pickles a callable is
refused. The shards themselves are raw tensor bytes, and non-tensor values are
read with ``torch.load(weights_only=True)`` by DCP itself.
"""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hetero.core.errors import CheckpointError

#: What a DCP ``.metadata`` may name: DCP's metadata classes, and plain value types.
_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
)
_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a torch.layout by its name, from a cache
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
    }
)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        layout = module == "torch" and isinstance(getattr(torch, name, None), torch.layout)
        fmt = module == "torch" and isinstance(getattr(torch, name, None), torch.memory_format)
        if module in _ALLOWED_MODULES or (module, name) in _ALLOWED or dtype or layout or fmt:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not checkpoint metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by :class:`_MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        path = Path(self._get_metadata_path(rank))
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
            raise CheckpointError(
                f"refusing checkpoint shards {path.parent}: {exc} (loading it could run code)"
            ) from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} is not checkpoint metadata")
        meta = getattr(metadata, "storage_meta", None)
        if meta is not None:
            meta.load_id = self.load_id
        return metadata


def shards_dir(path: Path, step: int) -> Path:
    """Where the shards of the checkpoint ``path`` at ``step`` go."""
    return path.with_name(f"{path.name}.step{step}.shards")


def save_shards(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    by_name: bool = False,
) -> None:
    """Collective: every rank writes its shards of model and optimizer into ``directory``.
    ``by_name``: the optimizer's hyperparameters too are kept per parameter name
    (``flatten_optimizer_state_dict``), for ranks that hold different parameters (pipeline
    stages): each rank's param groups name only its own parameters, so saved as groups
    they would not load onto another split."""
    model_sd, optim_sd = get_state_dict(
        model,
        optimizer if optimizer is not None else [],
        options=StateDictOptions(flatten_optimizer_state_dict=by_name),
    )
    try:
        dcp_save(
            {"model": model_sd, "optimizer": optim_sd},
            storage_writer=FileSystemWriter(str(directory)),
        )
    except Exception as exc:  # DCP wraps each rank's OSError in its own exception
        raise CheckpointError(
            f"cannot write checkpoint shards {directory}: {_first_line(exc)}"
        ) from None


def load_shards(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    by_name: bool = False,
) -> None:
    """Collective: load ``directory``'s shards into ``model`` and ``optimizer``, resharded
    for this run's ranks (``by_name`` as it was saved: :func:`save_shards`)."""
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint shards {directory} do not exist")
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] = (
        optimizer if optimizer is not None else []
    )
    reader = SafeReader(str(directory))
    # Read (and vet) the metadata first: inside dcp's load a refusal comes back wrapped,
    # after DCP has logged a traceback and tried per-rank metadata files.
    reader.read_metadata()
    options = StateDictOptions(flatten_optimizer_state_dict=by_name)
    model_sd, optim_sd = get_state_dict(model, optimizers, options=options)
    state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
    try:
        dcp_load(state, storage_reader=reader)
    except CheckpointError:
        raise
    except Exception as exc:  # DCP wraps a rank's failure: name the first line, no trace
        raise CheckpointError(
            f"cannot load checkpoint shards {directory}: {_first_line(exc)}"
        ) from None
    set_state_dict(
        model,
        optimizers,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"] if optimizer is not None else {},
        options=options,
    )


def remove_old_shards(path: Path, keep: Path) -> None:
    """Rank 0, after the file names ``keep``: the shard directories of earlier steps."""
    for old in path.parent.glob(f"{path.name}.step*.shards"):
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
