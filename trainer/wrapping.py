"""``Context.wrap``: a model moved to its rank's device and wrapped for uneven batches.

Replicated, it goes into DDP with the exact-weighting comm hook
(``trainer.gradients``) and the comm schedule (``trainer.commsched``); sharded,
into FSDP2 with the weighted reduce-scatter (``trainer.sharding``). Either way the
timing hooks (``trainer.timing``) are attached first, so compute-only time is
measured the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hetero.core.catalogue import BY_NAME
from hetero.core.errors import ConfigError
from hetero.trainer.activations import apply_mode
from hetero.trainer.commsched import AUTO, CommRecord, check_comm, comm_policy
from hetero.trainer.gradients import DEFERRED, weighted_allreduce_hook
from hetero.trainer.sharding import check_one_device_kind, check_shard, shard_model, shard_units

if TYPE_CHECKING:
    from hetero.trainer.context import Context


def wrap_model(
    ctx: Context,
    model: nn.Module,
    *,
    sync_batchnorm: bool,
    comm: str | None,
    shard: str | bool | None,
    offload: str | None,
    param_dtype: torch.dtype | None,
    activation_checkpointing: str | bool | None = None,
    **ddp_kwargs: Any,
) -> nn.Module:
    """What :meth:`Context.wrap` documents, for ``ctx``."""
    if comm is not None:
        ctx.comm_choice = check_comm(comm)
        ctx.comm = comm_policy(comm)
    if shard is None or isinstance(shard, bool):
        shard = {True: "full", False: "none", None: ctx.config.shard}[shard]
    offload = ctx.config.offload if offload is None else offload
    check_shard(shard, offload)
    if shard != "none" and ctx.comm_choice != AUTO:
        raise ConfigError(
            f"comm={ctx.comm_choice} schedules DDP's all-reduce; FSDP2 (shard) schedules "
            "its own reduce-scatters"
        )
    model = model.to(ctx.device)
    mode = ctx.config.activation_checkpointing
    if activation_checkpointing is not None:
        mode = BY_NAME["activation_checkpointing"].check(activation_checkpointing)
    # The units FSDP2 will shard the model into: no recomputed block may contain one.
    units = shard_units(model) if shard != "none" and ctx.world_size > 1 else []
    apply_mode(ctx, model, mode, sync_batchnorm=sync_batchnorm and ctx.world_size > 1, units=units)
    if ctx.world_size == 1:
        ctx.hooks.attach(model)
        return model
    if sync_batchnorm:
        if ctx.device.type != "cuda":
            raise ConfigError("sync_batchnorm needs CUDA ranks (PyTorch's SyncBatchNorm)")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if shard != "none":
        check_one_device_kind(ctx.device)
        sharded = shard_model(
            model,
            ctx.device,
            shard=shard,
            offload=offload,
            weighting=ctx.weighting,
            record_collective=ctx.clock.add_collective,
            record_stream_wait=ctx.clock.add_stream_wait,
            param_dtype=param_dtype,
        )
        ctx.hooks.attach(sharded)  # after fully_shard: first of its pre-forward hooks
        ctx.shard = shard
        return sharded
    ctx.hooks.attach(model)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, **ddp_kwargs)
    ctx.hooks.attach_wrapper(ddp)
    ddp.register_comm_hook(ctx.weighting, weighted_allreduce_hook)
    ctx._ddp = True
    # auto plans in deferred (trainer/commsched.py); a fixed choice is its own mode.
    ctx.weighting.mode = DEFERRED if ctx.comm_choice == AUTO else ctx.comm_choice
    ctx.comm_changes.append(
        CommRecord(ctx.global_step, ctx.weighting.mode, f"initial (comm={ctx.comm_choice})")
    )
    return ddp
