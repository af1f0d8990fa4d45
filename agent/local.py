"""``AgentLocal``: the endpoint the agent serves to its own training processes.

Rank 0 of a job reports each interval's statistics here and gets the plan
back. The agent forwards to the coordinator with a deadline shorter than the
trainer's, and if the coordinator is slow or unreachable it answers with the
last plan it knows for the job, so the trainer never waits on the control
plane, and keeps the report in its outbox for delivery once the coordinator is
back. Errors the coordinator returns for a bad request keep their status code.
"""

from __future__ import annotations

import logging
import threading

import grpc

from hetero.agent.outbox import Outbox
from hetero.security.auth import AGENT_TOKEN_ENV, JobTokens
from hetero.security.transport import ServerSecurity, bind, is_unreachable, new_server
from hetero.v1 import agent_pb2_grpc
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.agent.local")

#: Seconds a forwarded call may take: below the trainer's own deadline (0.5 s by default).
FORWARD_TIMEOUT_S = 0.4


class PlanCache:
    """The newest plan seen per job (from launch orders and coordinator answers)."""

    def __init__(self) -> None:
        self._plans: dict[str, tpb.Plan] = {}
        self._lock = threading.Lock()

    def offer(self, plan: tpb.Plan) -> None:
        if not plan.job_id:
            return
        with self._lock:
            known = self._plans.get(plan.job_id)
            if known is None or plan.version >= known.version:
                self._plans[plan.job_id] = plan

    def get(self, job_id: str) -> tpb.Plan | None:
        with self._lock:
            return self._plans.get(job_id)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._plans.pop(job_id, None)


class AgentLocalService(agent_pb2_grpc.AgentLocalServicer):  # type: ignore[misc, unused-ignore]
    def __init__(
        self,
        coordinator: pb_grpc.CoordinatorStub,
        plans: PlanCache,
        forward_timeout_s: float = FORWARD_TIMEOUT_S,
        outbox: Outbox | None = None,
        job_tokens: JobTokens | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.plans = plans
        self.forward_timeout_s = forward_timeout_s
        self.outbox = outbox
        #: With these, a call must carry the token of the job it names (a rank's own).
        self.job_tokens = job_tokens
        self._down_logged = False

    def _check_job(self, job_id: str, context: grpc.ServicerContext) -> None:
        """Abort unless the call carries ``job_id``'s token: checked here, not in an
        interceptor, because the job is in the request, which an interceptor never sees."""
        if self.job_tokens is not None and not self.job_tokens.matches(
            job_id, context.invocation_metadata()
        ):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"unauthenticated: the agent endpoint takes only job {job_id}'s own token "
                f"(the agent gives each rank its job's ${AGENT_TOKEN_ENV})",
            )

    def _fallback(self, job_id: str, exc: grpc.RpcError, context: grpc.ServicerContext) -> tpb.Plan:
        if not is_unreachable(exc):
            context.abort(exc.code(), exc.details() or "coordinator rejected the request")
        if not self._down_logged:
            self._down_logged = True
            log.warning(
                "coordinator unreachable (%s); answering trainers with cached plans", exc.code()
            )
        plan = self.plans.get(job_id)
        if plan is None:
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"coordinator unreachable and no plan known for job {job_id}",
            )
        assert plan is not None
        return plan

    def _recovered(self) -> None:
        if self._down_logged:
            self._down_logged = False
            log.info("coordinator reachable again")

    def ReportIntervalStats(
        self, req: tpb.IntervalReport, context: grpc.ServicerContext
    ) -> tpb.ReportIntervalStatsResponse:
        self._check_job(req.job_id, context)
        try:
            resp: tpb.ReportIntervalStatsResponse = self.coordinator.ReportIntervalStats(
                req, timeout=self.forward_timeout_s
            )
        except grpc.RpcError as exc:
            if self.outbox is not None and is_unreachable(exc):
                self.outbox.keep_report(req)
            return tpb.ReportIntervalStatsResponse(plan=self._fallback(req.job_id, exc, context))
        self._recovered()
        self.plans.offer(resp.plan)
        return resp

    def GetPlan(self, req: tpb.GetPlanRequest, context: grpc.ServicerContext) -> tpb.Plan:
        self._check_job(req.job_id, context)
        try:
            plan: tpb.Plan = self.coordinator.GetPlan(req, timeout=self.forward_timeout_s)
        except grpc.RpcError as exc:
            return self._fallback(req.job_id, exc, context)
        self._recovered()
        self.plans.offer(plan)
        return plan


def create_local_server(
    address: str,
    service: AgentLocalService,
    *,
    insecure: bool = False,
) -> tuple[grpc.Server, int]:
    """A server for ``address`` (port 0 = any free port) and its port; not started.

    With ``service.job_tokens`` every call needs its job's token (each rank gets its
    own as ``$HETERO_AGENT_TOKEN``); a non-loopback ``address`` needs them unless
    ``insecure``."""
    security = ServerSecurity(insecure=insecure, checked_by_service=service.job_tokens is not None)
    server = new_server(
        security,
        what="agent endpoint",
        hint=f"the agent gives its ranks ${AGENT_TOKEN_ENV}",
        max_workers=8,
        thread_name_prefix="local",
    )
    agent_pb2_grpc.add_AgentLocalServicer_to_server(service, server)  # type: ignore[no-untyped-call, unused-ignore]
    return server, bind(server, address, security, "agent endpoint")
