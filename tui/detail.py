"""The job-detail model: per-rank series over the job's intervals, the step-time
breakdown, plans and events, built from a ``JobDetail`` message.

Pure and immutable like ``state``: the detail worker builds it off the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.core.textsafe import printable
from hetero.tui.state import JobView, RankStats, job_view, rank_stats
from hetero.v1 import coordinator_pb2 as pb


@dataclass(frozen=True)
class Phases:
    """One rank's mean seconds per step by phase; ``other_s`` is what no phase covers."""

    rank: int
    data_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    optimizer_s: float
    other_s: float
    step_s: float
    #: False if the trainer reported compute only (drawn as forward).
    split: bool

    def parts(self) -> tuple[float, ...]:
        """Seconds in ``format.PHASE_STYLES`` order."""
        return (self.data_s, self.forward_s, self.backward_s, self.comm_s, self.optimizer_s)


def phases(r: RankStats) -> Phases:
    split = r.forward_s is not None and r.backward_s is not None
    forward = (r.forward_s or 0.0) if split else r.compute_s
    backward = (r.backward_s or 0.0) if split else 0.0
    data, comm, opt = r.data_s or 0.0, r.comm_wait_s or 0.0, r.optimizer_s or 0.0
    other = max(0.0, r.step_s - (data + forward + backward + comm + opt))
    return Phases(r.rank, data, forward, backward, comm, opt, other, r.step_s, split)


@dataclass(frozen=True)
class PlanView:
    version: int
    apply_at_step: int
    batches: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class EventView:
    time_unix_s: float
    kind: str
    message: str


@dataclass(frozen=True)
class JobDetailView:
    job: JobView
    #: end_step of each interval, oldest first; every series below is aligned to it.
    steps: tuple[int, ...]
    #: batches[rank][i]: the rank's batch in interval i.
    batches: tuple[tuple[int, ...], ...]
    #: Compute-only seconds per sample; NaN where the rank ran no step.
    per_sample_s: tuple[tuple[float, ...], ...]
    #: Mean loss per interval, only intervals that reported one: (end_step, loss).
    loss: tuple[tuple[int, float], ...]
    #: The newest interval's breakdown, rank order.
    breakdown: tuple[Phases, ...]
    plans: tuple[PlanView, ...]
    events: tuple[EventView, ...]


def detail_view(msg: pb.JobDetail) -> JobDetailView:
    job = job_view(msg.job)
    world = job.world_size
    steps: list[int] = []
    batches: list[list[int]] = [[] for _ in range(world)]
    per_sample: list[list[float]] = [[] for _ in range(world)]
    loss: list[tuple[int, float]] = []
    for iv in msg.intervals:
        by_rank = {r.rank: r for r in iv.ranks}
        steps.append(iv.end_step)
        loss_sum, samples = 0.0, 0
        for rank in range(world):
            r = by_rank.get(rank)
            batches[rank].append(r.batch if r is not None else 0)
            ok = r is not None and r.batch > 0 and r.steps > 0
            per_sample[rank].append(r.compute_s / r.batch if ok and r else float("nan"))
            if r is not None and r.HasField("loss_sum") and r.samples:
                loss_sum, samples = loss_sum + r.loss_sum, samples + r.samples
        if samples:
            loss.append((iv.end_step, loss_sum / samples))
    newest = msg.intervals[-1].ranks if msg.intervals else []
    return JobDetailView(
        job=job,
        steps=tuple(steps),
        batches=tuple(tuple(b) for b in batches),
        per_sample_s=tuple(tuple(p) for p in per_sample),
        loss=tuple(loss),
        breakdown=tuple(phases(rank_stats(r)) for r in newest),
        plans=tuple(
            PlanView(p.version, p.apply_at_step, tuple(p.batches), printable(p.reason))
            for p in msg.plans
        ),
        events=tuple(
            EventView(e.time_unix_s, printable(e.kind), printable(e.message))
            for e in msg.job.events
        ),
    )
