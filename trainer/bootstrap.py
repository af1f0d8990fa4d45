"""What ``ht.init`` does before training: the validated ``TrainerConfig``, and from this
rank's environment (``hetero.core.rankenv.RankEnv``) its device, its emulated
slowdown, the backend every rank agrees on, and the process group.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hetero.core import defaults, rankenv
from hetero.core.catalogue import BY_NAME
from hetero.core.errors import ConfigError, DistributedError
from hetero.core.rankenv import RankEnv
from hetero.trainer import procgroup
from hetero.trainer.commsched import AUTO
from hetero.trainer.emulation import Slowdown, parse_slowdowns
from hetero.trainer.netif import interface_toward

log = logging.getLogger("hetero.trainer")


def _collective_timeout_s() -> float:
    """``HETERO_COLLECTIVE_TIMEOUT_S`` if set (agent-launched jobs), else 600 s."""
    return RankEnv.from_env().collective_timeout_s or defaults.COLLECTIVE_TIMEOUT_S


@dataclass(frozen=True)
class TrainerConfig:
    """How a training process balances. Validated on construction."""

    policy: str = "dynamic"
    rebalance_interval: int = defaults.REBALANCE_INTERVAL_STEPS
    min_batch: int = 1
    max_batch: tuple[int | None, ...] | None = None
    emulate_slowdown: str | None = None
    output_dir: Path | None = None
    device: str = "auto"
    backend: str | None = None
    warmup_steps: int = 1
    settle_steps: int = 1
    history_intervals: int = 32
    #: When gradient all-reduces start: ``auto`` (measured), ``overlap``, ``deferred``.
    comm: str = AUTO
    #: FSDP2 instead of DDP: ``none``, ``grad_op`` or ``full`` (``trainer.sharding``).
    shard: str = "none"
    #: ``none`` or ``params`` (FSDP2's CPUOffloadPolicy); needs ``shard``.
    offload: str = "none"
    #: ``auto`` (per rank, where memory binds), ``on`` or ``off`` (``trainer.activations``).
    activation_checkpointing: str = "auto"
    #: Pipeline stages ``ctx.wrap`` cuts the model into (1: none; ``trainer.pipeline``).
    pipeline: int = 1
    #: Seconds a collective may wait for a peer before failing (a dead peer must not
    #: hang the job): ``HETERO_COLLECTIVE_TIMEOUT_S`` under an agent, else 600.
    collective_timeout_s: float = field(default_factory=_collective_timeout_s)
    #: Where rank 0 writes every interval's figures for TensorBoard (``trainer.tensorboard``).
    tensorboard: Path | None = None

    def __post_init__(self) -> None:
        """Each field is checked by its option in the catalogue (``hetero.core.catalogue``:
        the bounds ``hetero-train``, job.yaml and ``ht.init`` share); an error names it."""
        for name in _CHECKED:
            BY_NAME[name].check(getattr(self, name))
        if self.max_batch is not None:
            BY_NAME["max_batch"].check(self.max_batch)


#: The fields of ``TrainerConfig`` that are catalogue options checked by value.
_CHECKED = (
    "policy",
    "rebalance_interval",
    "min_batch",
    "emulate_slowdown",
    "device",
    "backend",
    "warmup_steps",
    "settle_steps",
    "history_intervals",
    "collective_timeout_s",
    "comm",
    "shard",
    "offload",
    "activation_checkpointing",
    "pipeline",
)


def pick_device(choice: str, env: RankEnv) -> torch.device:
    """``choice`` (auto, cpu, cuda) on the device ``env`` gives this rank."""
    index = env.cuda_index(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if choice == "cuda" and index is None:
        placed = f" ({rankenv.DEVICE}={env.device})" if env.device else ""
        raise ConfigError(
            f"device cuda requested but local rank {env.local_rank} has no GPU{placed}"
        )
    if index is not None and choice in ("cuda", "auto"):
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _gloo_interface() -> None:
    """Point Gloo at the interface toward ``MASTER_ADDR`` unless the user chose one
    (``GLOO_SOCKET_IFNAME``): left alone it binds where the hostname resolves,
    which is loopback on many hosts, and ranks on other hosts cannot reach it."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    iface = interface_toward(os.environ.get("MASTER_ADDR", ""))
    if iface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        log.info("Gloo uses interface %s (toward MASTER_ADDR)", iface)


def default_backend(device: torch.device, env: RankEnv) -> str:
    """NCCL only when every rank can be on CUDA, else Gloo; all ranks must agree.

    A launcher that knows the whole job (``hetero-train --nproc``, an agent, the
    coordinator) says so in ``HETERO_BACKEND``. Otherwise this rank infers it
    from its own node: NCCL if it is on CUDA and the node has a GPU for every
    local rank, so a node mixing GPU and CPU ranks picks Gloo on every rank. A
    rank placed on a GPU of its own (``HETERO_DEVICE``: Slurm's one GPU per task,
    ``hetero.trainer.slurm``) sees that one GPU alone and counts as having it.
    """
    if env.backend is not None:
        return env.backend
    own_gpu = env.device_index is not None
    if device.type == "cuda" and (
        own_gpu or torch.cuda.device_count() >= (env.local_world_size or 1)
    ):
        return "nccl"
    return "gloo"


def emulated_slowdowns(
    config: TrainerConfig, env: RankEnv, device: torch.device
) -> dict[int, Slowdown]:
    """The job's emulated slowdowns by rank: the config's, else (under an agent, for a
    user script) the environment's."""
    slowdown_spec = config.emulate_slowdown or env.slowdown_spec
    slowdowns: dict[int, Slowdown] = parse_slowdowns(slowdown_spec)
    bad = [r for r in slowdowns if r >= env.world_size]
    if bad:
        raise ConfigError(f"--emulate-slowdown names rank {bad[0]} of a {env.world_size}-rank job")
    if slowdowns and device.type == "cuda":
        raise ConfigError("emulated slowdown is for CPU ranks; on GPUs use real load")
    return slowdowns


def every_ranks_slowdowns(mine: dict[int, Slowdown]) -> dict[int, Slowdown]:
    """The job's slowdowns as every rank knows them (collective, once the group formed).

    A rank an agent started knows only its own (``HETERO_EMULATE_SLOWDOWN``, or its own
    ``--emulate-slowdown R:F`` for a built-in job), yet rank 0 writes the report and the
    summary, which must say EMULATED when any rank was. Each rank's entry for itself wins;
    a rank's entries for others (a job-wide ``--emulate-slowdown``) fill in the rest.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    views: list[dict[int, Slowdown] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    merged: dict[int, Slowdown] = {}
    for view in views:
        merged.update(view or {})
    for owner, view in enumerate(views):
        if view and owner in view:
            merged[owner] = view[owner]
    return merged


def join_process_group(
    backend: str, rank: int, world_size: int, device: torch.device, timeout_s: float
) -> None:
    """Join the job's process group; nothing alone or when already joined. A collective
    waits ``timeout_s`` seconds for a peer before failing."""
    if world_size > 1 and not dist.is_initialized():
        if backend == "gloo":
            _gloo_interface()
        try:
            procgroup.join(
                backend,
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=timeout_s),
                device_id=device if device.type == "cuda" else None,
            )
        except (RuntimeError, ValueError) as exc:
            raise DistributedError(f"joining the process group failed: {exc}") from None
