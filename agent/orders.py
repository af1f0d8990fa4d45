"""Launch orders into processes: the argv and environment of one rank, from one function.

A built-in job runs ``hetero-train`` as that rank; a user job runs its own
``command``. The order carries the job's part once (``RankLaunch``: rank, world,
rendezvous, backend, device, attempt, collective timeout, the typed options as their
catalogue text); :func:`rank_process` completes it with what only the agent knows
(its local endpoint, the ranks on this node, the initial plan, the progress file, the
CPU threads) into one ``hetero.core.rankenv.RankEnv`` and the argv beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hetero.core.catalogue.commandline import argv_for
from hetero.core.rankenv import JobTerms, LaunchPlan, RankEnv
from hetero.security.auth import AGENT_TOKEN_ENV, Secret, scrub_environment
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


@dataclass(frozen=True)
class RankProcess:
    """What starts one rank: its argv and its whole environment."""

    argv: list[str]
    env: dict[str, str]
    rank_env: RankEnv


def rank_process(
    order: pb.RankLaunch,
    *,
    python: str,
    output_dir: Path,
    agent_endpoint: str,
    threads: int,
    local_world_size: int,
    base: Mapping[str, str] | None = None,
    agent_token: Secret | None = None,
    progress_file: Path | None = None,
) -> RankProcess:
    """The rank's argv and environment. The environment is ``base`` (the agent's, without
    its credentials) plus the rank's variables and, if the agent has one, its endpoint
    token (never in argv). ``progress_file`` is the file the trainer touches as it steps
    (``HETERO_PROGRESS_FILE``), which the agent's watchdog reads. A value no rank could
    read (a port out of range, a bad device) is a ``ConfigError``."""
    cuda = order.device_kind == tpb.DEVICE_KIND_CUDA
    plan = order.plan
    rank_env = RankEnv(
        rank=order.rank,
        world_size=order.world_size,
        local_rank=order.local_rank,
        local_world_size=local_world_size,
        master_addr=order.master_addr or None,
        master_port=order.master_port or None,
        backend=order.backend or None,
        device=f"cuda:{order.device_index}" if cuda else "cpu",
        job_id=order.job_id,
        agent_endpoint=agent_endpoint,
        plan=LaunchPlan(plan.version, tuple(plan.batches)) if plan.batches else None,
        emulate_slowdown=order.emulated_slowdown or 1.0,
        collective_timeout_s=order.collective_timeout_s or None,
        progress_file=progress_file,
        attempt=order.attempt,
        launched=True,
        threads=threads,
        job=JobTerms.of_options(order.args.options),
    )
    env = dict(scrub_environment(os.environ if base is None else base))
    env.update(rank_env.to_env())
    env["PYTHONUNBUFFERED"] = "1"
    if agent_token is not None:
        env[AGENT_TOKEN_ENV] = agent_token.reveal()
    return RankProcess(_argv(order, python, output_dir, cuda), env, rank_env)


def _argv(order: pb.RankLaunch, python: str, output_dir: Path, cuda: bool) -> list[str]:
    """A built-in job's options reach ``hetero-train`` as flags built from the order's
    option map (``hetero.core.catalogue``): the agent needs to know none of them. An
    emulated slowdown reaches built-in jobs as ``--emulate-slowdown`` (user scripts read
    ``HETERO_EMULATE_SLOWDOWN`` through ``ht.init()``)."""
    a = order.args
    if a.command:
        return list(a.command)
    argv = [python, "-m", "hetero.trainer.cli", *argv_for(dict(a.options))]
    argv += ["--device", "cuda" if cuda else "cpu"]
    argv += ["--output-dir", str(output_dir), "--summary-json", str(output_dir / "summary.json")]
    argv.append("--json")
    if a.resume:  # a restarted job with checkpoints: continue from its last one, if any
        argv += ["--resume", "auto"]
    if order.emulated_slowdown > 1.0:
        argv += ["--emulate-slowdown", f"{order.rank}:{order.emulated_slowdown:g}"]
    return argv
