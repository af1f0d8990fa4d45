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
"""

from hetero.trainer.checkpoint import load_checkpoint, save_checkpoint
from hetero.trainer.context import Context, HeteroLoader, TrainerConfig, init
from hetero.trainer.sampler import UnevenBatchSampler, epoch_permutation

__all__ = [
    "Context",
    "HeteroLoader",
    "TrainerConfig",
    "UnevenBatchSampler",
    "epoch_permutation",
    "init",
    "load_checkpoint",
    "save_checkpoint",
]
