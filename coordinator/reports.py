"""An interval report: the one path by which a job's plan changes while it runs.

Rank 0 of a job reports every rank's statistics at each rebalance boundary (through
its agent); ``handle`` stores them, appends them to the job's history in memory (the
one history: ``state.Job.history``, the current attempt's newest complete intervals),
flags new stragglers, leaves a rank out when that pays (``exclusion``), and fits the
job's policy (``core.replan``, the balancer the trainer embeds) once. A new plan is
stored only if it changes the batches of the newest plan; the answer is the newest
plan. The caller writes what was collected (``cluster.Cluster.take``): a new plan or
a restart is committed before the rank hears of it; an interval that changed neither
is answered at once and written with the writer's next batch.

The fit runs on the event loop: for a job of 8 ranks it is a few milliseconds of CPU
(``docs/control-plane.md``), less than a process pool's round trip would save the loop,
and a report is handled from start to end with no await before its commit, so a job's
reports are handled in the order they arrive and nothing changes the job under its
fit. Were fits ever moved to a process pool, that order would need a lock per job.
"""

from __future__ import annotations

import math
from collections import deque

from hetero.coordinator import exclusion, persist, wire
from hetero.coordinator.cluster import Cluster
from hetero.coordinator.models import IntervalStatRow
from hetero.coordinator.state import Job, Plan
from hetero.coordinator.store.intervals import rank_interval
from hetero.core import replan
from hetero.core.balancer import Constraints, DeviceProfile, RankInterval
from hetero.core.balancer.straggler import LOOKBACK, new_stragglers
from hetero.core.errors import ConfigError
from hetero.core.states import JobState
from hetero.v1 import types_pb2 as tpb

#: Intervals a job keeps in memory: enough for straggler detection (``LOOKBACK`` and the
#: interval before) and the balancer (``replan``).
HISTORY = max(LOOKBACK + 1, replan.HISTORY_WINDOW + 1)
#: The event kind that says why balancing does not beat equal batches for a job.
NOT_HELPING = persist.NOT_HELPING
#: The optional measurements of ``RankIntervalStats`` the balancer reads.
_MEASURED = ("data_s", "optimizer_s", "switch_s", "busy_cv", "input_s", "input_cv")


def handle(cluster: Cluster, req: tpb.IntervalReport, now: float) -> Plan:
    """Store the interval and the plan it leads to; the newest plan. Raises
    ``HeteroError`` (nothing changed) for an unknown job or a report the balancer cannot
    use."""
    job = cluster.job(req.job_id)
    check(req, job)
    rows = wire.interval_rows(req)
    common = {"job_id": job.id, "end_step": req.end_step, "plan_version": req.plan_version}
    stored = tuple({**row, **common, "received_at_unix_s": now} for row in rows)
    cluster.add(persist.AddRows(IntervalStatRow, stored))
    job.last_step = max(job.last_step, req.end_step)
    job.heard_at_unix_s = now  # an attached job's rank 0 is alive (``attach.sweep``)
    cluster.save(job, ranks=False)
    plan = job.plan
    if req.plan_version < job.attempt_first_plan or plan is None:
        return _newest(job)  # an earlier attempt's interval: kept, not part of the history
    ranks = tuple(rank_interval(r) for r in sorted(rows, key=lambda r: int(r["rank"])))
    _remember(job, req, ranks, now)
    history = [list(rs) for _, rs in job.history]
    for flag in new_stragglers(history):
        cluster.event("straggler", flag.message, now=now, job=job)
    if _left_out(cluster, job, req, history, now):
        return _newest(job)  # it restarts: the restart's plan is the next one
    if not replan.should_replan(
        ran_version=req.plan_version,
        attempt_first_version=job.attempt_first_plan,
        newest_version=plan.version,
        job_state=JobState[job.state],
        end_step=req.end_step,
        rebalance_interval=job.rebalance_interval,
    ):
        return plan
    constraints = Constraints(job.global_batch, job.world_size, job.min_batch)
    ran = tuple(r.batch for r in sorted(req.ranks, key=lambda r: r.rank))
    profiles = [
        DeviceProfile(r.device_name, r.effective_score, None, r.emulated_slowdown)
        for r in job.ranks
    ]
    result = replan.replan(
        job.policy,
        history,
        replan.running_plan(ran, constraints) or plan.batches,
        constraints,
        profiles,
        req.end_step,
        replan.horizon(job.rebalance_interval, req.end_step, job.total_steps),
    )
    decision = result.decision
    if decision.not_helping:
        message = f"hetero is not helping here: {decision.not_helping}"
        if job.not_helping != message:
            job.not_helping = message
            cluster.event(NOT_HELPING, message, now=now, job=job)
    # "Changes the plan" is against the newest plan, not the batches the interval ran: a
    # trainer applies a plan after its loader's prefetch, so an interval reported with
    # the newest version may have run the one before, and the balancer, asked from
    # those, chooses the newest again (stored, a version without a change).
    if not decision.changed or tuple(decision.batches) == plan.batches:
        return plan
    new = cluster.new_plan(
        job,
        decision.batches,
        result.apply_at_step,
        job.policy,
        decision.reason,
        now=now,
        predicted_step_s=decision.predicted_step_s,
    )
    batches = ",".join(str(b) for b in new.batches)
    cluster.event("replanned", f"plan v{new.version}: {batches} ({new.reason})", now=now, job=job)
    return new


def _newest(job: Job) -> Plan:
    if job.plan is None:
        raise ConfigError(f"job {job.id} has no plan yet")
    return job.plan


def _remember(
    job: Job, req: tpb.IntervalReport, ranks: tuple[RankInterval, ...], now: float
) -> None:
    """The interval joins the job's history (a re-sent one replaces its step), and is its
    newest for the live view; the attempt's first one dates its start-up (placement to
    first step: its arrival less the time its steps took, the slowest rank's)."""
    first = not job.history
    kept = [(step, rs) for step, rs in job.history if step != req.end_step]
    kept.append((req.end_step, ranks))
    kept.sort(key=lambda item: item[0])
    job.history = deque(kept[-HISTORY:], maxlen=HISTORY)
    latest = job.latest
    if not isinstance(latest, tpb.IntervalReport) or latest.end_step <= req.end_step:
        job.latest = req
    plan = job.plan
    if first and plan is not None and plan.version == job.attempt_first_plan:
        ran = max((r.steps * r.step_s for r in req.ranks), default=0.0)
        job.start_up_s = max(0.0, now - plan.created_at_unix_s - ran)


def _left_out(
    cluster: Cluster,
    job: Job,
    req: tpb.IntervalReport,
    history: list[list[RankInterval]],
    now: float,
) -> bool:
    """Restart the job without a rank when its measurements say so and it pays (the
    time saved over the steps left beats the restart's cost); True if it restarts."""
    names = {n.id: n.name for n in cluster.state.nodes.values()}
    decision = exclusion.while_running(job.spec, job, history, names)
    if decision is not None:
        decision = exclusion.paying(decision, job.spec, job, req.end_step, job.start_up_s)
    if decision is None:
        return False
    cluster.restart_without(job, decision, now=now)
    return True


def check(req: tpb.IntervalReport, job: Job) -> None:
    """Reject reports the balancer cannot use: wrong rank set, negative or NaN times."""
    ranks = sorted(r.rank for r in req.ranks)
    if ranks != list(range(job.world_size)):
        raise ConfigError(f"job {job.id}: report has ranks {ranks}, want 0..{job.world_size - 1}")
    if req.end_step < 0:
        raise ConfigError(f"job {job.id}: end_step must be >= 0, got {req.end_step}")
    for r in req.ranks:
        # Input wait and the optimizer are part of the busy time the balancer fits; it
        # reads a plan change's cost, the steps' spread and the input rate and its
        # spread too.
        phases = [getattr(r, f) for f in _MEASURED if r.HasField(f)]
        values = (r.compute_s, r.step_s, *phases)
        if r.batch < 0 or r.steps < 0 or not all(math.isfinite(v) and v >= 0 for v in values):
            raise ConfigError(f"job {job.id} rank {r.rank}: batch, steps and times must be >= 0")
