"""The library inside every training process.

A plain DDP script adopts it in a few lines::

    from hetero import trainer as ht

    ctx = ht.init(policy="dynamic")
    model = ctx.wrap(model)
    loader = ctx.loader(dataset, global_batch=512)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        ctx.backward(loss)
        optimizer.step(); optimizer.zero_grad()
        ctx.step()

``ht.train(model="resnet50", epochs=2, ...)`` runs a built-in job instead, with
``hetero-train``'s options as keywords (``hetero.core.catalogue``).
"""

import importlib
import os
from typing import TYPE_CHECKING, Any

# A rank may hold gRPC channels (to its agent, or to the coordinator it attached to)
# while its DataLoader forks workers: gRPC's fork handlers then skip themselves and log
# a line per fork ("Other threads are currently calling into gRPC, skipping fork()
# handlers"). No worker uses the parent's channels, so the handlers are off unless the
# user's environment says otherwise; it takes effect only if grpc is not imported yet,
# as the agent does (``agent/cli.py``).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

if TYPE_CHECKING:
    from hetero.trainer.checkpoint import RunIdentity, load_checkpoint, save_checkpoint
    from hetero.trainer.context import Context, HeteroLoader, StreamLoader, TrainerConfig
    from hetero.trainer.sampler import UnevenBatchSampler, epoch_permutation
    from hetero.trainer.start import init
    from hetero.trainer.stream import split_shards

#: The API's names and the modules that define them, imported on first use: the
#: package itself imports no torch, so ``hetero-train`` answers ``--help`` and a bad
#: flag before torch has loaded (seconds), and ``python -m hetero.trainer.X`` pays
#: only for what X needs.
_LAZY = {
    "RunIdentity": "checkpoint",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "Context": "context",
    "HeteroLoader": "context",
    "StreamLoader": "context",
    "TrainerConfig": "context",
    "init": "start",
    "UnevenBatchSampler": "sampler",
    "epoch_permutation": "sampler",
    "split_shards": "stream",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hetero.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hetero.trainer.{module}"), name)
    globals()[name] = value
    return value


def train(**options: Any) -> dict[str, Any] | None:
    """A built-in job in this process: :func:`hetero.trainer.job.train` (loaded on first use,
    so a training loop that only calls ``init`` does not import the built-in models)."""
    from hetero.trainer.job import train as run

    return run(**options)


__all__ = [
    "Context",
    "HeteroLoader",
    "RunIdentity",
    "StreamLoader",
    "TrainerConfig",
    "UnevenBatchSampler",
    "epoch_permutation",
    "init",
    "load_checkpoint",
    "save_checkpoint",
    "split_shards",
    "train",
]
