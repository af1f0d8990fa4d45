"""The Coordinator gRPC servicer: each RPC is one session and one transaction.

Its handlers are grouped by what they serve: nodes and their agents
(``node_rpcs``), jobs (``job_rpcs``), plans and interval reports (``plan_rpcs``);
``rpc`` turns their errors into status codes. ``WatchCluster`` is streamed by
the grpc.aio server (``asyncserver``) from :meth:`CoordinatorService.snapshot`.
"""

from __future__ import annotations

from hetero.coordinator.deps import Deps
from hetero.coordinator.job_rpcs import JobHandlers
from hetero.coordinator.node_rpcs import NodeHandlers
from hetero.coordinator.plan_rpcs import PlanHandlers
from hetero.coordinator.rpc import abort_for
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

__all__ = ["CoordinatorService", "Deps", "abort_for"]


class CoordinatorService(  # type: ignore[misc, unused-ignore]
    NodeHandlers, JobHandlers, PlanHandlers, pb_grpc.CoordinatorServicer
):
    """Every unary RPC of ``hetero.v1.Coordinator``; see the handler groups."""
