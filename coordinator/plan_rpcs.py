"""The Coordinator RPCs of plans: trainers (through their agent) report each
interval's statistics and get the plan to run; the re-plan rule is
``hetero.core.replan``'s, a report's work ``intervalreports``'."""

from __future__ import annotations

import grpc

from hetero.coordinator import intervalreports, store, wire
from hetero.coordinator.rpc import Handlers, rpc
from hetero.core import replan
from hetero.v1 import types_pb2 as tpb


class PlanHandlers(Handlers):
    """ReportIntervalStats and GetPlan, which rank 0 calls through its agent."""

    @rpc
    def ReportIntervalStats(
        self, req: tpb.IntervalReport, context: grpc.ServicerContext
    ) -> tpb.ReportIntervalStatsResponse:
        """Store the interval and the plan it leads to (``intervalreports.handle``): in
        the report process of ``deps.reports`` where there is one and it is ready,
        else on this thread (the fit in ``deps.replanner``'s worker where there is
        one and no report process: that one's rare fallbacks fit here, and start no
        second worker); then update this process's caches."""
        now = self.deps.clock()
        handled = None
        if self.deps.reports is not None:
            handled = self.deps.reports.handle(req, now)
            if handled is not None and self.deps.histories is not None:
                # The worker stored an interval this process's history of the job lacks.
                self.deps.histories.drop(req.job_id)
        if handled is None:
            replanner = self.deps.replanner if self.deps.reports is None else None
            fit = replanner.replan if replanner else replan.replan
            handled = intervalreports.handle(self.deps.sessions, self.deps.histories, fit, req, now)
        if self.deps.plans is not None:
            self.deps.plans.put(req.job_id, handled.reply)
        if handled.restarted:
            self.deps.invalidate_caches()  # the ranks' stop orders reach their agents now
            if self.deps.capacity is not None:
                self.deps.capacity.changed()  # devices freed, wherever the report ran
        return tpb.ReportIntervalStatsResponse(plan=handled.reply)

    @rpc
    def GetPlan(self, req: tpb.GetPlanRequest, context: grpc.ServicerContext) -> tpb.Plan:
        if self.deps.plans is not None:
            return self.deps.plans.get(req.job_id)
        with self._read() as s:
            return wire.plan_message(store.latest_plan(s, store.get_job(s, req.job_id).id))
