"""Launch orders into processes: the argv and environment of one rank.

A built-in job runs ``hetero-train`` as that rank; a user job runs its own
``command``. Both get the torch.distributed environment from the coordinator
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
the NCCL settings every hetero process uses (``trainer.launch.rank_env``), the
job id, the agent's local endpoint and the coordinator's initial plan.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from hetero.auth import AGENT_TOKEN_ENV, Secret, scrub_environment
from hetero.trainer.launch import rank_env
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

#: Samples in hetero-train's synthetic dataset (its --num-samples default): turns epochs into steps.
SYNTHETIC_SAMPLES = 8192


def rank_command(order: pb.RankLaunch, python: str, output_dir: Path) -> list[str]:
    """argv of the rank. An emulated slowdown reaches built-in jobs as ``--emulate-slowdown``
    (user scripts read ``HETERO_EMULATE_SLOWDOWN`` through ``ht.init()``)."""
    a = order.args
    if a.command:
        return list(a.command)
    if a.HasField("steps"):
        steps = a.steps
    else:
        steps = max(a.epochs, 1) * math.ceil(SYNTHETIC_SAMPLES / max(a.global_batch, 1))
    argv = [
        python,
        "-m",
        "hetero.trainer.cli",
        "--model",
        a.model,
        "--dataset",
        a.dataset or "synthetic",
        "--global-batch",
        str(a.global_batch),
        "--steps",
        str(steps),
        "--policy",
        a.policy,
        "--rebalance-interval",
        str(a.rebalance_interval),
        "--lr",
        repr(a.lr),
        "--seed",
        str(a.seed),
        "--device",
        "cuda" if order.device_kind == tpb.DEVICE_KIND_CUDA else "cpu",
        "--output-dir",
        str(output_dir),
        "--summary-json",
        str(output_dir / "summary.json"),
        "--json",
    ]
    if a.data_dir:
        argv += ["--data-dir", a.data_dir]
    if a.checkpoint_dir:
        argv += ["--checkpoint-dir", a.checkpoint_dir]
        argv += ["--checkpoint-interval", str(a.checkpoint_interval_steps)]
        if a.resume:  # a restarted job: continue from the last checkpoint, if one was written
            argv += ["--resume", "auto"]
    if order.emulated_slowdown > 1.0:
        argv += ["--emulate-slowdown", f"{order.rank}:{order.emulated_slowdown:g}"]
    return argv


def rank_environment(
    order: pb.RankLaunch,
    *,
    agent_endpoint: str,
    threads: int,
    local_world_size: int,
    base: Mapping[str, str] | None = None,
    agent_token: Secret | None = None,
    progress_file: Path | None = None,
) -> dict[str, str]:
    """The rank's environment: ``base`` (the agent's) without its credentials, plus the
    job's variables and, if the agent has one, its endpoint token (never in argv).
    ``progress_file`` is the file the trainer touches as it steps
    (``HETERO_PROGRESS_FILE``), which the agent's watchdog reads."""
    env = rank_env(
        order.rank,
        order.world_size,
        order.master_port,
        threads=threads,
        base=scrub_environment(os.environ if base is None else base),
    )
    env.update(order.env)  # the coordinator's RANK, MASTER_ADDR, HETERO_JOB_ID, ...
    plan = order.plan
    env.update(
        LOCAL_WORLD_SIZE=str(local_world_size),
        HETERO_AGENT_ENDPOINT=agent_endpoint,
        HETERO_JOB_ID=order.job_id,
        HETERO_EMULATE_SLOWDOWN=f"{order.emulated_slowdown:g}",
        HETERO_PLAN=f"{plan.version}:{','.join(str(b) for b in plan.batches)}",
        PYTHONUNBUFFERED="1",
    )
    if agent_token is not None:
        env[AGENT_TOKEN_ENV] = agent_token.reveal()
    if progress_file is not None:
        env["HETERO_PROGRESS_FILE"] = str(progress_file)
    return env
