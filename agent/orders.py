"""Launch orders into processes: the argv and environment of one rank.

A built-in job runs ``hetero-train`` as that rank; a user job runs its own
``command``. Both get one ``hetero.core.rankenv.RankEnv``: the job's part from the
coordinator (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``, the backend, the device, the job id ...), completed here with
what only the agent knows (its local endpoint, the ranks on this node, the
initial plan, the progress file, the CPU threads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from hetero.core.catalogue.commandline import argv_for
from hetero.core.rankenv import LaunchPlan, RankEnv
from hetero.security.auth import AGENT_TOKEN_ENV, Secret, scrub_environment
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


def rank_command(order: pb.RankLaunch, python: str, output_dir: Path) -> list[str]:
    """argv of the rank. A built-in job's options reach ``hetero-train`` as flags built from
    the order's option map (``hetero.core.catalogue``): the agent needs to know none of
    them. An emulated slowdown reaches built-in jobs as ``--emulate-slowdown`` (user
    scripts read ``HETERO_EMULATE_SLOWDOWN`` through ``ht.init()``)."""
    a = order.args
    if a.command:
        return list(a.command)
    options = dict(a.options) if a.options else _options_of_older_coordinator(a)
    argv = [python, "-m", "hetero.trainer.cli", *argv_for(options)]
    argv += [
        "--device",
        "cuda" if order.device_kind == tpb.DEVICE_KIND_CUDA else "cpu",
        "--output-dir",
        str(output_dir),
        "--summary-json",
        str(output_dir / "summary.json"),
        "--json",
    ]
    if a.checkpoint_dir and a.resume:  # a restarted job: continue from its last checkpoint, if any
        argv += ["--resume", "auto"]
    if order.emulated_slowdown > 1.0:
        argv += ["--emulate-slowdown", f"{order.rank}:{order.emulated_slowdown:g}"]
    return argv


def _options_of_older_coordinator(a: pb.TrainingArgs) -> dict[str, str]:
    """The option map a coordinator that predates ``TrainingArgs.options`` meant, from its
    fixed fields (its ``epochs`` are counted by the rank from the dataset's real size)."""
    options = {
        "model": a.model,
        "dataset": a.dataset or "synthetic",
        "global_batch": str(a.global_batch),
        "policy": a.policy,
        "rebalance_interval": str(a.rebalance_interval),
        "lr": repr(a.lr),
        "seed": str(a.seed),
    }
    if a.HasField("steps"):
        options["steps"] = str(a.steps)
    else:
        options["epochs"] = str(max(a.epochs, 1))
    if a.data_dir:
        options["data_dir"] = a.data_dir
    if a.checkpoint_dir:
        options["checkpoint_dir"] = a.checkpoint_dir
        options["checkpoint_interval"] = str(a.checkpoint_interval_steps)
    return options


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
    env = dict(scrub_environment(os.environ if base is None else base))
    env.update(order.env)  # a newer coordinator's variables reach the rank too
    env.update(
        order_rank_env(order, agent_endpoint, threads, local_world_size, progress_file).to_env()
    )
    env["PYTHONUNBUFFERED"] = "1"
    if agent_token is not None:
        env[AGENT_TOKEN_ENV] = agent_token.reveal()
    return env


def order_rank_env(
    order: pb.RankLaunch,
    agent_endpoint: str,
    threads: int,
    local_world_size: int,
    progress_file: Path | None = None,
) -> RankEnv:
    """The coordinator's part of the environment (``order.env``, which wins over the
    order's own fields as it always has) completed with the agent's."""
    fields = RankEnv(
        rank=order.rank,
        world_size=order.world_size,
        local_rank=order.local_rank,
        master_addr=order.master_addr or None,
        master_port=order.master_port or None,
        backend=order.backend or None,
    )
    job = RankEnv.from_env({**fields.to_env(), **order.env})
    plan = order.plan
    return replace(
        job,
        local_world_size=local_world_size,
        agent_endpoint=agent_endpoint,
        job_id=order.job_id,
        emulate_slowdown=order.emulated_slowdown or 1.0,
        plan=LaunchPlan(plan.version, tuple(plan.batches)) if plan.batches else None,
        progress_file=progress_file,
        threads=threads,
        launched=True,
    )
