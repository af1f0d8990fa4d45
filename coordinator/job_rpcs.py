"""The Coordinator RPCs of jobs: users submit, list, follow and cancel them."""

from __future__ import annotations

import logging

import grpc

from hetero.coordinator import admission, exclusion, jobpages, logwire, store, views, wire
from hetero.coordinator.placement import PlacementError, place, predict
from hetero.coordinator.rpc import Handlers, caller_of, invalid, rpc, state_name
from hetero.core.jobspec import JobSpec, check_priority, parse_jobspec
from hetero.core.states import JobState
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator")


class JobHandlers(Handlers):
    """SubmitJob, ListJobs, GetJob, CancelJob, GetJobLogs, GetJobDetail."""

    @rpc
    def SubmitJob(
        self, req: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        """Refuse a spec over the limits or one that can never fit; else queue the job,
        and place it at once when nothing ahead of it waits for its devices."""
        limits = self.deps.limits
        admission.check_spec_bytes(req.spec_yaml, limits)  # before the parser sees it
        # Parse before touching the database: a bad spec stores nothing.
        spec = parse_jobspec(
            req.spec_yaml,
            source=source_name(req.source_name),
            allowed_roots=self.deps.allowed_roots,
        )
        priority = req.priority if req.HasField("priority") else spec.priority
        check_priority(priority)
        now, cfg = self.deps.clock(), self.deps.sweep_config().queue
        if req.dry_run:
            return self._dry_run(req, spec, now)
        owner = caller_of(context)
        with self.deps.sessions() as s:
            devices = store.device_slots(
                s, now=now, timeout_s=cfg.heartbeat_timeout_s, cpu_capacity=cfg.ranks_per_cpu_device
            )
            admission.check_fits(spec, devices)
            admission.check_jobs_per_user(owner, store.jobs_of(s, owner), limits)
            job = store.new_job(spec, req.spec_yaml, now=now, priority=priority, owner=owner)
            placed = store.enqueue(s, job, cfg, now=now)
            spec = exclusion.spec_without(spec, exclusion.excluded_of(job))  # as placed
            job_msg = self._job(s, job, detail=True)
            s.commit()
        self.deps.invalidate_caches()  # its launches reach the agents at their next poll
        log.info(
            "job %s (%s) submitted: %d ranks, %s",
            job_msg.id,
            spec.name,
            spec.world_size,
            job_msg.backend or f"queued ({job_msg.message})",
        )
        predictions = [wire.prediction_message(p) for p in predict(spec, placed)] if placed else []
        return pb.SubmitJobResponse(job_id=job_msg.id, job=job_msg, predictions=predictions)

    def _dry_run(self, req: pb.SubmitJobRequest, spec: JobSpec, now: float) -> pb.SubmitJobResponse:
        """What a submission would do, storing nothing: the placement it gets now, or the
        one it would get on the idle cluster and why it would wait."""
        cfg = self.deps.sweep_config().queue
        with self._read() as s:
            devices = store.device_slots(
                s, now=now, timeout_s=cfg.heartbeat_timeout_s, cpu_capacity=cfg.ranks_per_cpu_device
            )
            admission.check_fits(spec, devices)
            waits = ""
            try:
                placed = place(spec, devices, 0)
            except PlacementError:
                waits = "would queue: " + admission.reason(spec, devices, set())
                placed = place(spec, admission.idle(devices), 0)
        job_msg = wire.dry_run_job(spec, req.spec_yaml, placed)
        if (note := exclusion.profile_note(spec, placed)) is not None:
            waits = f"{waits}; {note}" if waits else note
        job_msg.message = waits
        predictions = [wire.prediction_message(p) for p in predict(spec, placed)]
        return pb.SubmitJobResponse(job=job_msg, predictions=predictions)

    @rpc
    def ListJobs(
        self, req: pb.ListJobsRequest, context: grpc.ServicerContext
    ) -> pb.ListJobsResponse:
        """A page of jobs, newest first; ``next_page_token`` goes on (``jobpages``)."""
        states = [state_name(JobState, st, "states") for st in req.states]
        limit = jobpages.page_limit(req.limit)
        after = jobpages.decode(req.page_token)
        with self._read() as s:
            jobs = store.list_jobs(s, states, limit + 1, after)  # one more: is there a next?
            page = jobs[:limit]
            token = jobpages.encode(page[-1]) if len(jobs) > limit else ""
            return pb.ListJobsResponse(
                jobs=views.job_messages(s, page),
                next_page_token=token,
                total=store.count_jobs(s, states),
            )

    @rpc
    def GetJob(self, req: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        with self._read() as s:
            return self._job(s, store.get_job(s, req.job_id), detail=True)

    @rpc
    def CancelJob(self, req: pb.CancelJobRequest, context: grpc.ServicerContext) -> pb.Job:
        now = self.deps.clock()
        with self.deps.sessions.begin() as s:
            job = store.cancel_job(s, req.job_id, now=now)
            s.flush()
            # Its devices count as free at once (its ranks stop): the queue moves now.
            store.admit_queued(s, self.deps.sweep_config().queue, now=now)
            reply = self._job(s, job, detail=True)
        self.deps.invalidate_caches()  # its stop orders, and launches of jobs placed now
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
