"""The Coordinator RPCs of jobs: users submit, list, follow and cancel them."""

from __future__ import annotations

import logging

import grpc

from hetero.coordinator import logwire, store, views, wire
from hetero.coordinator.placement import place, predict
from hetero.coordinator.rpc import Handlers, invalid, rpc, state_name
from hetero.core.jobspec import parse_jobspec
from hetero.core.states import JobState
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator")


class JobHandlers(Handlers):
    """SubmitJob, ListJobs, GetJob, CancelJob, GetJobLogs, GetJobDetail."""

    @rpc
    def SubmitJob(
        self, req: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        # Parse before touching the database: a bad spec stores nothing.
        spec = parse_jobspec(
            req.spec_yaml,
            source=source_name(req.source_name),
            allowed_roots=self.deps.allowed_roots,
        )
        now = self.deps.clock()
        with self.deps.sessions() as s:
            devices = store.device_slots(s, now=now, timeout_s=self.deps.heartbeat_timeout_s)
            port = store.next_master_port(s, self.deps.master_port_base, self.deps.master_port_span)
            placed = place(spec, devices, port)
            predictions = [wire.prediction_message(p) for p in predict(spec, placed)]
            if req.dry_run:
                job_msg = wire.dry_run_job(spec, req.spec_yaml, placed)
                return pb.SubmitJobResponse(job=job_msg, predictions=predictions)
            job = store.create_job(s, spec, req.spec_yaml, placed, now=now)
            job_msg = self._job(s, job, detail=True)
            s.commit()
        self.deps.invalidate_caches()  # its launches reach the agents at their next poll
        log.info(
            "job %s (%s) submitted: %d ranks, %s",
            job.id,
            spec.name,
            spec.world_size,
            placed.backend,
        )
        return pb.SubmitJobResponse(job_id=job_msg.id, job=job_msg, predictions=predictions)

    @rpc
    def ListJobs(
        self, req: pb.ListJobsRequest, context: grpc.ServicerContext
    ) -> pb.ListJobsResponse:
        states = [state_name(JobState, st, "states") for st in req.states]
        if req.limit < 0:
            raise invalid(f"limit must be >= 0, got {req.limit}")
        limit = min(req.limit or 100, 1000)
        with self._read() as s:
            jobs = store.list_jobs(s, states, limit)
            return pb.ListJobsResponse(jobs=[self._job(s, j) for j in jobs])

    @rpc
    def GetJob(self, req: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        with self._read() as s:
            return self._job(s, store.get_job(s, req.job_id), detail=True)

    @rpc
    def CancelJob(self, req: pb.CancelJobRequest, context: grpc.ServicerContext) -> pb.Job:
        with self.deps.sessions.begin() as s:
            job = store.cancel_job(s, req.job_id, now=self.deps.clock())
            reply = self._job(s, job, detail=True)
        self.deps.invalidate_caches()  # its stop orders
        return reply

    @rpc
    def GetJobLogs(
        self, req: pb.GetJobLogsRequest, context: grpc.ServicerContext
    ) -> pb.GetJobLogsResponse:
        limit = min(req.limit or 1000, 10_000)
        with self._read() as s:
            rows = store.job_logs(s, req.job_id, req.after_seq, limit)
            lines = [logwire.log_message(r) for r in rows]
        next_seq = lines[-1].seq if lines else req.after_seq
        return pb.GetJobLogsResponse(lines=lines, next_seq=next_seq)

    @rpc
    def GetJobDetail(
        self, req: pb.GetJobDetailRequest, context: grpc.ServicerContext
    ) -> pb.JobDetail:
        if req.max_intervals < 0:
            raise invalid(f"max_intervals must be >= 0, got {req.max_intervals}")
        after = req.after_step if req.HasField("after_step") else None
        with self._read() as s:
            return views.job_detail(s, req.job_id, req.max_intervals, after)


def source_name(name: str) -> str:
    """The client's name for the spec file, as errors show it (one line, short)."""
    clean = " ".join(name.split())[:200]
    return clean or "job.yaml"
