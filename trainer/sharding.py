"""Sharded data parallelism with uneven batches, through PyTorch's FSDP2 (``fully_shard``).

``shard="grad_op"`` keeps each unit's parameters gathered from its forward to
its backward (``reshard_after_forward=False``: gradients and optimizer state
sharded, like ZeRO-2); ``shard="full"`` frees them after the forward and
gathers them again in backward (``True``: ZeRO-3). ``offload="params"`` is
FSDP2's ``CPUOffloadPolicy``: sharded parameters, gradients and optimizer state
in host memory, the optimizer step on the host.

**Exact gradients.** Rank ``i``'s loss is its mean over ``b_i`` samples. FSDP2
by default averages the reduce-scatter (divides the sum by ``W``), which is the
global mean only for equal batches. Here every unit gets

- ``set_gradient_divide_factor(1.0)`` and ``set_force_sum_reduction_for_comms(True)``:
  a plain SUM, no division. The divide factor is per FSDP module, not recursive,
  so it is set on every unit (set on the root alone, the units' gradients came
  out divided by ``W`` on 3 Gloo ranks). SUM also matters on Gloo: without it,
  a factor other than ``W`` becomes ``ReduceOp.PREMUL_SUM``, which Gloo refuses
  ("Cannot use ReduceOp.PREMUL_SUM with Gloo", torch 2.14.1).
- a reduce-scatter (:class:`WeightedReduceScatter`, FSDP2's
  ``set_custom_reduce_scatter``) that multiplies its input by
  ``WeightingState.scale`` first: ``1`` after ``Context.backward`` (which
  already scaled the loss by ``b_i/B``), ``b_i/B`` when a loop calls
  ``loss.backward()`` itself — the same two paths as DDP's comm hook
  (``trainer.gradients``). Either way the sharded gradient is
  ``Σ_i (b_i/B) · g_i``, the gradient of the mean loss over the global batch.

**Compute-only timing.** FSDP2 gathers each unit's parameters before its
forward (and, under ``full``, before its backward) and reduce-scatters its
gradients after: collectives inside forward and backward, each waiting for the
slowest peer. On Gloo they block the host, so the time each one took is
measured here (:class:`TimedAllGather`, :class:`WeightedReduceScatter`) and the
step clock moves it from compute to communication (``StepClock.add_collective``).
On CUDA the collectives run on FSDP2's own streams and the host does not wait
in them; the compute stream does, and :mod:`hetero.trainer.streamwaits` brackets
those waits with events that the step clock moves to communication the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)

from hetero.core.catalogue.limits import OFFLOAD_MODES, SHARD_MODES
from hetero.core.errors import ConfigError
from hetero.trainer import procgroup, streamwaits
from hetero.trainer.gradients import WeightingState

NONE, GRAD_OP, FULL = SHARD_MODES
OFFLOAD_PARAMS = OFFLOAD_MODES[2]
assert OFFLOAD_PARAMS == "params"


def check_shard(shard: str, offload: str) -> None:
    """A ``ConfigError`` for a value or pair the catalogue refuses (``ctx.wrap``'s own check)."""
    from hetero.core.catalogue import BY_NAME

    BY_NAME["shard"].check(shard)
    BY_NAME["offload"].check(offload)
    if offload != "none" and shard == NONE:
        raise ConfigError("offload needs shard grad_op or full (FSDP2 offloads)")
    if offload not in ("none", OFFLOAD_PARAMS):
        raise ConfigError(
            "offload optimizer alone is not available: FSDP2 offloads the sharded "
            "parameters, gradients and optimizer state together (params)"
        )


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules that become FSDP units before the root: each element of every
    ``nn.ModuleList`` (transformer blocks), else the root's direct children that hold
    parameters. A unit's parameters are gathered together, so units bound the memory
    of gathered parameters to about one block at a time under ``full``."""
    listed = [
        m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst.children()
    ]
    if listed:
        return [m for m in listed if any(True for _ in m.parameters())]
    return [m for m in model.children() if any(True for _ in m.parameters())]


class _CollectiveTimer:
    """Host seconds spent in blocking collectives, handed to ``record``."""

    def __init__(self, record: Callable[[float], None], blocking: bool) -> None:
        self.record = record
        self.blocking = blocking

    def timed(self, call: Callable[[], dist.Work | None]) -> dist.Work | None:
        if not self.blocking:
            return call()
        t0 = time.perf_counter()
        work = call()
        if work is not None:
            work.wait()  # Gloo: the wait for the slowest peer is here, not in compute
        self.record(time.perf_counter() - t0)
        return None


class TimedAllGather(DefaultAllGather):
    """FSDP2's all-gather, synchronous on host-blocking backends so its time is measured."""

    def __init__(self, timer: _CollectiveTimer) -> None:
        self.timer = timer

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        call = super().__call__
        return self.timer.timed(lambda: call(output_tensor, input_tensor, group, async_op))


class WeightedReduceScatter(DefaultReduceScatter):
    """FSDP2's reduce-scatter with the input scaled by ``state.scale`` (see the module doc)."""

    def __init__(self, state: WeightingState, timer: _CollectiveTimer) -> None:
        self.state = state
        self.timer = timer

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        if self.state.scale != 1.0:
            input_tensor.mul_(self.state.scale)
        call = super().__call__
        return self.timer.timed(lambda: call(output_tensor, input_tensor, group, op, async_op))


def shard_model(
    model: nn.Module,
    device: torch.device,
    *,
    shard: str,
    offload: str,
    weighting: WeightingState,
    record_collective: Callable[[float], None],
    record_stream_wait: streamwaits.Record | None = None,
    param_dtype: torch.dtype | None = None,
) -> nn.Module:
    """``model`` (already on ``device``) sharded over the default process group (the same
    module object, now also an ``FSDPModule``). It holds the group: drop it before
    ``procgroup.leave`` (see there).

    ``param_dtype`` (e.g. ``torch.bfloat16``) gathers and computes in that dtype
    while the sharded parameters, the gradient reduction and the optimizer stay
    in fp32 (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``).
    """
    check_shard(shard, offload)
    if shard == NONE:
        raise ConfigError("shard_model needs shard grad_op or full")
    options: dict[str, Any] = {
        "reshard_after_forward": shard == FULL,
        "mesh": procgroup.device_mesh(device.type),  # one that leaving releases
    }
    if param_dtype is not None:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=torch.float32
        )
    if offload == OFFLOAD_PARAMS:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    for unit in shard_units(model):
        fully_shard(unit, **options)
    # The root keeps its parameters gathered after forward: its backward comes first.
    fully_shard(model, **{**options, "reshard_after_forward": False})
    timer = _CollectiveTimer(record_collective, blocking=device.type == "cpu")
    gather, scatter = TimedAllGather(timer), WeightedReduceScatter(weighting, timer)
    for module in fsdp_modules(model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
        module.set_custom_all_gather(gather)
        module.set_custom_reduce_scatter(scatter)
    if device.type == "cuda" and record_stream_wait is not None:
        streamwaits.attach(fsdp_modules(model), record_stream_wait)
    return model


def fsdp_modules(model: nn.Module) -> Sequence[FSDPModule]:
    """Every FSDP unit of ``model``, the root included."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def full_weights(model: nn.Module) -> dict[str, Any]:
    """The whole (unsharded) state dict of a sharded ``model`` on every rank (collective),
    keyed as the unsharded model's: for an unsharded copy to evaluate or time alone."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def check_one_device_kind(device: torch.device) -> None:
    """Refuse a job whose ranks are on different kinds of device (collective): FSDP2
    gathers every shard onto one device type."""
    kinds: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(kinds, device.type)
    if len(set(kinds)) > 1:
        mixed = ", ".join(sorted({str(k) for k in kinds}))
        raise ConfigError(f"shard needs every rank on one kind of device, not {mixed}")


assert issubclass(DefaultAllGather, AllGather) and issubclass(DefaultReduceScatter, ReduceScatter)
