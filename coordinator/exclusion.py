"""Leaving a rank out of a job: when the coordinator does it, and what the job keeps.

A job whose spec allows it (``resources.allow_exclusion``: on by default for
built-in jobs, off for ``command:`` jobs) may run without one rank when
``hetero.core.balancer.exclusion``'s rule forecasts it faster so, the global
batch unchanged (the others take the rank's samples, so the gradient and the
learning rate mean what they did). Never at a first start: hardware profiles
are a quick benchmark, too noisy to act on (``profile_note``; ``submit
--dry-run`` says what they forecast). The coordinator acts at two moments:

- **a running job**: when the measured forecast has said so for the newest
  ``ExclusionRule.consecutive`` intervals and the job has a checkpoint directory, it is
  restarted from its checkpoint without the rank (``measured``; the restart
  uses none of its ``max_restarts``);
- **a restart after a failure**: the same measured rule over the attempt that
  just ended, when all of its nodes are still up.

One rank leaves per restart, each decided on the measurements of the attempt
that ran without the ranks left out before it (a GPU beside two CPU ranks loses
one CPU rank, then, measured again, the other), and never the job's last rank.
What is left out is what made the rank slow: its emulated factor when the spec
gave it one, else its device, which then gets no rank of the job at any later
placement (unless other ranks of the job share it, as ranks share a CPU device:
then it was not the device). Every decision is an event with the forecast's
numbers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from hetero.coordinator import lifecycle
from hetero.coordinator.models import JobRow, RankRow
from hetero.coordinator.placement import DeviceSlot, Placement
from hetero.coordinator.state import Job, Rank
from hetero.core.balancer import (
    Constraints,
    ExclusionForecast,
    ExclusionRule,
    History,
)
from hetero.core.jobspec import JobSpec

RULE = ExclusionRule()
#: A job as stored (``models.JobRow``) or as the coordinator holds it (``state.Job``).
AnyJob = JobRow | Job
#: A restart's start-up (placement to first step) assumed while the attempt has not
#: reported yet: a cold Python with torch and a rendezvous, on a loaded host.
UNMEASURED_START_UP_S = 30.0


@dataclass(frozen=True)
class Excluded:
    """A rank left out: ``spec_rank`` indexes the spec's ranks (its ``emulate_slowdown``
    entry is dropped); ``node_id``/``device_index`` name the device left out with it,
    None when the rank's emulated factor was what made it slow."""

    spec_rank: int
    node_id: str | None = None
    device_index: int | None = None


def excluded_of(job: AnyJob) -> tuple[Excluded, ...]:
    """The ranks left out of ``job`` so far (its ``excluded`` column)."""
    if not job.excluded:
        return ()
    return tuple(Excluded(**entry) for entry in json.loads(job.excluded))


def may_exclude(spec: JobSpec, job: AnyJob) -> bool:
    """Whether ``job`` may lose a rank now: allowed, and at least two ranks left. The
    forecast that decides is fitted on the current attempt's intervals alone, so a
    second rank leaves only on measurements of the job without the first: none may
    leave while a rank left out of this attempt is still in it (its restart pending)."""
    pending = spec.world_size - len(excluded_of(job)) < job.world_size
    return spec.resources.allow_exclusion and job.world_size >= 2 and not pending


def spec_ranks(spec: JobSpec, job: AnyJob) -> list[int]:
    """The spec rank behind each rank of the job's current attempt: the spec's ranks
    less those left out, the first ``job.world_size`` of them (a restart on fewer
    devices keeps the first ranks, ``recovery.replace_spec_ranks``)."""
    gone = {e.spec_rank for e in excluded_of(job)}
    return [r for r in range(spec.world_size) if r not in gone][: job.world_size]


def spec_without(spec: JobSpec, excluded: Sequence[Excluded]) -> JobSpec:
    """``spec`` less the excluded ranks: fewer ranks, their emulated factors dropped,
    the same global batch (also when the file gave a per-rank ``batch_size``)."""
    gone = {e.spec_rank for e in excluded}
    if not gone:
        return spec
    keep = tuple(f for r, f in enumerate(spec.emulate_slowdown) if r not in gone)
    return dataclasses.replace(
        spec,
        resources=dataclasses.replace(spec.resources, ranks=len(keep)),
        options=spec.options.replace(global_batch=spec.global_batch, batch_size=None),
        emulate_slowdown=keep,
    )


def devices_without(
    devices: Sequence[DeviceSlot], excluded: Sequence[Excluded]
) -> list[DeviceSlot]:
    """The device slots a placement of the job may use: those left out are gone."""
    gone = {(e.node_id, e.device_index) for e in excluded if e.node_id is not None}
    return [d for d in devices if (d.node_id, d.index) not in gone]


def record(job: AnyJob, entry: Excluded) -> None:
    entries = [dataclasses.asdict(e) for e in (*excluded_of(job), entry)]
    job.excluded = json.dumps(entries)


def _entry(
    spec_rank: int, factor: float, device: tuple[str, int], devices: Sequence[tuple[str, int]]
) -> Excluded:
    """What leaves with the rank: its device too, unless the spec's emulation made it
    slow or another rank of the job runs on the same device (a CPU device shared by
    ranks is as fast for all of them: it was not the device)."""
    if factor != 1.0 or list(devices).count(device) > 1:
        return Excluded(spec_rank)
    return Excluded(spec_rank, *device)


def _describe(rank: int, node: str, device: str, slowdown: float) -> str:
    emulated = f", emulated x{slowdown:g}" if slowdown != 1.0 else ""
    return f"rank {rank} ({device} on {node}{emulated})"


@dataclass(frozen=True)
class Decision:
    """A rank to leave out, why (``forecast``), and the event text (``message``)."""

    entry: Excluded
    forecast: ExclusionForecast
    message: str


def profile_note(spec: JobSpec, placement: Placement) -> str | None:
    """What ``hetero-coord submit --dry-run`` says when the hardware profiles forecast the
    job faster without its slowest rank (``ExclusionRule.from_profiles``); None otherwise.

    Only a note: a first start leaves no rank out. A profile is a quick benchmark
    taken once; on a loaded host two identical CPU nodes scored far enough apart to
    drop a rank of a job held even by ``min_batch``, and such a mistake could not be
    undone (one exclusion per job, its device kept out). The job's own intervals
    decide instead, at the cost of one restart."""
    if not spec.resources.allow_exclusion or len(placement.ranks) < 2:
        return None
    scores = [r.effective_score for r in placement.ranks]
    constraints = Constraints(spec.global_batch, spec.world_size, spec.min_batch)
    forecast = RULE.from_profiles(scores, constraints)
    if forecast is None:
        return None
    return (
        f"profiles say rank {forecast.rank} holds the job back even at min_batch "
        f"{spec.min_batch} ({forecast.message}); it starts with every rank and is restarted "
        f"without it if its measured step times agree"
    )


def measured(
    spec: JobSpec, job: AnyJob, history: History, node_names: dict[str, str] | None = None
) -> Decision | None:
    """A rank of the current attempt to leave out, from the job's own intervals
    (``ExclusionRule.measured``), or None. ``history``: the attempt's complete
    intervals, oldest first, each in rank order; ``node_names`` by node id (an in-memory
    job's ranks name their node by id only; a stored rank's row knows it)."""
    if not may_exclude(spec, job):
        return None
    ranks: list[RankRow | Rank] = sorted(job.ranks, key=lambda r: r.rank)
    constraints = Constraints(job.global_batch, job.world_size, job.min_batch)
    forecast = RULE.measured(history, constraints, kinds=[r.device_kind for r in ranks])
    if forecast is None:
        return None
    row = ranks[forecast.rank]
    spec_rank = spec_ranks(spec, job)[forecast.rank]
    devices = [(r.node_id, r.device_index) for r in ranks]
    entry = _entry(spec_rank, spec.emulate_slowdown[spec_rank], devices[forecast.rank], devices)
    node = node_names.get(row.node_id, row.node_id) if node_names is not None else None
    if node is None:
        assert isinstance(row, RankRow)
        node = row.node.name
    who = _describe(row.rank, node, row.device_name, row.emulated_slowdown)
    emulated = " (emulated slowdown)" if any(r.emulated_slowdown != 1.0 for r in ranks) else ""
    message = (
        f"job {job.name}: {who} left out, from the job's measured step times{emulated} "
        f"over its newest {RULE.consecutive} intervals: {forecast.message}"
    )
    return Decision(entry, forecast, message)


def while_running(
    spec: JobSpec, job: AnyJob, history: History, node_names: dict[str, str] | None = None
) -> Decision | None:
    """``measured`` for a RUNNING job that has a checkpoint directory to resume from
    (without one, a restart would start the training over). Whether the restart pays
    for itself is ``paying``'s to say."""
    if job.state != lifecycle.RUNNING or spec.checkpoint is None:
        return None
    return measured(spec, job, history, node_names)


def paying(
    decision: Decision, spec: JobSpec, job: AnyJob, step: int, start_up_s: float | None
) -> Decision | None:
    """``decision`` with the restart's balance added to its event text, or None when the
    time the forecast saves over the steps left after ``step`` does not exceed what
    the restart costs: the job's own start-up (placement to first step, measured on
    this attempt, ``store.attempt_start_up_s``; ``UNMEASURED_START_UP_S`` before
    that) plus the steps since the last checkpoint, at most ``interval_steps``, run
    again. A job near its end keeps its ranks: a restart there cannot win back its
    cost, and the stop order could reach the ranks after their last step (a restart
    with nothing left to run)."""
    if spec.checkpoint is None:
        return None
    if job.total_steps is None:
        return decision  # an open-ended run: every step left is a step saved
    forecast = decision.forecast
    left = job.total_steps - step
    now_s = job.global_batch / forecast.samples_per_s
    without_s = job.global_batch / forecast.samples_per_s_without
    start = UNMEASURED_START_UP_S if start_up_s is None else start_up_s
    cost = start + spec.checkpoint.interval_steps * without_s
    saved = left * (now_s - without_s)
    if saved <= cost:
        return None
    how = "measured" if start_up_s is not None else "not yet measured, assumed"
    balance = (
        f"over the {left} steps left that saves {saved:.1f} s against a restart of "
        f"{cost:.1f} s (start-up {how} {start:.1f} s, and up to "
        f"{spec.checkpoint.interval_steps} steps since the checkpoint run again)"
    )
    return dataclasses.replace(decision, message=f"{decision.message}; {balance}")
