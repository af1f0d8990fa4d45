"""A job its own launcher started, attached to a coordinator (``HETERO_COORDINATOR``).

Ranks started by ``torchrun``, ``srun`` or a Kubernetes Job know no agent. With
``HETERO_COORDINATOR=HOST:PORT`` in their environment (and a credential, as for
``hetero-coord``: ``HETERO_TOKEN_FILE`` or ``HETERO_TOKEN``, TLS through
``HETERO_TLS_*``), ``ctx.loader`` attaches the job: every rank tells rank 0 its host
and device (one ``all_gather_object``), rank 0 calls ``AttachJob`` and from then on
reports each interval to the coordinator and applies its plans, exactly as under an
agent (``control.AgentPlanner``, talking to the coordinator instead). The job shows in
``hetero-coord jobs`` and ``hetero-top`` with its launcher; ``ctx.close`` detaches it
(SUCCEEDED, or FAILED when the rank stops on an error). Placement and restarts stay
with the launcher.

The control plane never stalls training: a coordinator that does not answer within
:data:`ATTACH_TIMEOUT_S`, or refuses, costs one warning, and the job trains on the
embedded planner, as it would without the variable.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import torch
import torch.distributed as dist

from hetero.core.balancer import Constraints
from hetero.core.rankenv import JOB_NAME
from hetero.security.transport import client_channel, client_security, remote_error
from hetero.trainer.control import AgentPlanner, Progress
from hetero.trainer.exchange import Planner
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

if TYPE_CHECKING:
    from hetero.trainer.context import Context

log = logging.getLogger("hetero.trainer.attach")

#: The variable that names the coordinator to attach to.
COORDINATOR_ENV = "HETERO_COORDINATOR"
#: Seconds rank 0 waits for ``AttachJob`` and for ``DetachJob``.
ATTACH_TIMEOUT_S = 5.0


def wanted(ctx: Context, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this job attaches: a coordinator is named and no agent launched it."""
    env = os.environ if environ is None else environ
    return bool(env.get(COORDINATOR_ENV)) and not ctx.env.agent_endpoint


def launcher(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Who started the ranks and its id of the job, from the variables it sets."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID"):
        return "slurm", env["SLURM_JOB_ID"]
    if env.get("TORCHELASTIC_RUN_ID"):
        run = env["TORCHELASTIC_RUN_ID"]
        return "torchrun", "" if run == "none" else run
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes", env.get("JOB_NAME", env.get("HOSTNAME", ""))
    return "external", ""


def planner(
    ctx: Context, fallback: Planner, constraints: Constraints, progress: Progress
) -> Planner:
    """Rank 0's planner for an attached job, or ``fallback`` (every other rank, or when
    the coordinator cannot be reached). Collective: every rank calls it."""
    mine = _this_rank(ctx)
    ranks: list[Any] = [None] * ctx.world_size
    if ctx.world_size > 1:
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    if ctx.rank != 0:
        return fallback
    address = os.environ[COORDINATOR_ENV]
    name, job_id = launcher()
    request = pb.AttachJobRequest(
        name=os.environ.get(JOB_NAME) or Path(sys.argv[0] or "python").stem or "job",
        launcher=name,
        launcher_job_id=job_id,
        global_batch=constraints.global_batch,
        policy=ctx.config.policy,
        rebalance_interval=ctx.config.rebalance_interval,
        min_batch=constraints.min_batch,
        ranks=[pb.AttachedRank(**r) for r in ranks],
    )

    def connect() -> tuple[grpc.Channel, Any]:
        channel = client_channel(address, client_security(None, address=address))
        return channel, pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call, unused-ignore]

    try:
        channel, stub = connect()
        try:
            answer = stub.AttachJob(request, timeout=ATTACH_TIMEOUT_S)
        finally:
            channel.close()
    except grpc.RpcError as exc:
        log.warning(
            "not attached to the coordinator (%s): training on the embedded planner",
            remote_error(exc, f"coordinator {address}"),
        )
        return fallback
    except Exception as exc:  # a bad credential file or TLS path: one line, training goes on
        log.warning("not attached to the coordinator %s (%s): training on", address, exc)
        return fallback
    log.info("attached to the coordinator %s as job %s", address, answer.job_id)
    return AttachedPlanner(
        address,
        answer.job_id,
        fallback,
        constraints,
        progress,
        plan_version=answer.plan.version,
        connect=connect,
        peer="coordinator",
    )


class AttachedPlanner(AgentPlanner):
    """``AgentPlanner`` on the coordinator itself; at its close it detaches the job."""

    def close(self, *, failed: bool = False) -> None:
        super().close(failed=failed)  # the last report, and its channel closed
        channel, stub = self._open()
        request = pb.DetachJobRequest(
            job_id=self.job_id,
            failed=failed,
            message="a rank stopped on an error" if failed else "",
        )
        try:
            stub.DetachJob(request, timeout=ATTACH_TIMEOUT_S)
        except grpc.RpcError as exc:
            log.warning("job %s not detached: %s", self.job_id, remote_error(exc, "coordinator"))
        finally:
            channel.close()


def _this_rank(ctx: Context) -> dict[str, Any]:
    device = ctx.device
    cuda = device.type == "cuda"
    profiles = ctx.profiles
    return {
        "host": socket.gethostname(),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "device_kind": tpb.DEVICE_KIND_CUDA if cuda else tpb.DEVICE_KIND_CPU,
        "compute_score": profiles[ctx.rank].compute_score if profiles else 0.0,
        "emulated_slowdown": ctx.slowdown_at(0),
    }
