"""Jobs launched elsewhere: what the coordinator keeps of a job its own launcher started.

A job started by ``torchrun``, ``srun`` or a Kubernetes Job, with ``HETERO_COORDINATOR``
in its ranks' environment, is *attached* by its rank 0 (``AttachJob``): the coordinator
plans its batches from its interval reports, as for the jobs it places, and shows it in
``hetero-coord jobs`` and ``hetero-top`` beside them, marked with its launcher. It places
nothing and restarts nothing: its ranks run on no node of the coordinator's, and their
launcher owns them.

The job is stored as the others are, by its spec's text: the job-file keys the
coordinator plans with (``name``, ``global_batch``, ``steps``, ``policy``,
``rebalance_interval``, ``min_batch``, ``resources.ranks``) and an ``attached:`` section
with the launcher and every rank's host and device, which the coordinator writes itself
(a submitted job file may not carry it: ``check_submitted``). At start the coordinator
reads the section back (:func:`parse_stored`) and the job has its ranks again.

An attached job whose rank 0 has said nothing for :data:`SILENCE_S` (no report, no
detach) is taken as ended by its launcher without a word, and fails.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from hetero.coordinator import lifecycle
from hetero.coordinator.state import Job, Plan, Rank
from hetero.coordinator.wire import PB_TO_KIND
from hetero.core.balancer import Constraints, DeviceProfile, make_policy
from hetero.core.errors import ConfigError
from hetero.core.jobspec import JobSpec, parse_jobspec
from hetero.core.states import RankState
from hetero.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from hetero.coordinator.cluster import Cluster

#: Seconds an attached job's rank 0 may stay silent before the job counts as lost.
SILENCE_S = 600.0
#: The job file's key this module owns.
KEY = "attached"
#: Ranks an attached job may have, at most (a bound on what one request stores).
MAX_RANKS = 4096
#: Characters of a launcher's name, its job id, a host or a device name, at most.
MAX_TEXT = 128


@dataclass(frozen=True)
class AttachedRank:
    host: str
    device_name: str
    device_kind: str
    compute_score: float
    emulated_slowdown: float


@dataclass(frozen=True)
class Attached:
    """The ``attached:`` section: who launched the job, its own id, and its ranks."""

    launcher: str
    launcher_job_id: str
    ranks: tuple[AttachedRank, ...]

    def job_ranks(self) -> list[Rank]:
        """The job's ranks as the state holds them: on no node (``node_id`` "")."""
        return [
            Rank(
                rank=i,
                node_id="",
                device_index=0,
                device_kind=r.device_kind,
                device_name=r.device_name,
                local_rank=0,
                state=RankState.RUNNING.name,
                emulated_slowdown=r.emulated_slowdown,
                effective_score=r.compute_score / r.emulated_slowdown,
            )
            for i, r in enumerate(self.ranks)
        ]

    @property
    def shown(self) -> str:
        """ "slurm job 4242", or "torchrun" without an id."""
        return (
            f"{self.launcher} job {self.launcher_job_id}" if self.launcher_job_id else self.launcher
        )


def attach_job(c: Cluster, req: pb.AttachJobRequest, *, now: float, owner: str) -> tuple[Job, Plan]:
    """The attached job, RUNNING, and its first plan (its policy's initial one over the
    ranks' scores, as a placed job's)."""
    spec, text, attached = from_request(req)
    ranks = attached.job_ranks()
    job = Job(
        id=uuid.uuid4().hex[:12],
        name=spec.name,
        spec=spec,
        spec_yaml=text,
        state=lifecycle.RUNNING,
        submitted_at_unix_s=now,
        world_size=len(ranks),
        owner=owner,
        ranks=ranks,
        launcher=attached.shown,
        heard_at_unix_s=now,
    )
    c.state.add_job(job)
    c.save(job)  # first: its plan and events refer to its row
    profiles = [
        DeviceProfile(r.device_name, r.effective_score, None, r.emulated_slowdown) for r in ranks
    ]
    constraints = Constraints(spec.global_batch, len(ranks), spec.min_batch)
    batches = make_policy(spec.policy).initial(constraints, profiles)
    plan = c.new_plan(job, batches, 0, spec.policy, "initial plan (attached)", now=now)
    where = ", ".join(sorted({r.host for r in attached.ranks}))
    message = f"job {job.name} attached: {len(ranks)} ranks started by {attached.shown} on {where}"
    c.event("job_attached", message, now=now, job=job)
    return job, plan


def detach_job(c: Cluster, job_id: str, *, failed: bool, message: str, now: float) -> Job:
    """An attached job ended, as its rank 0 says: SUCCEEDED, or FAILED with ``message``."""
    job = c.job(job_id)
    if not job.launcher:
        raise lifecycle.TransitionError(f"job {job.id} was not attached: its agents end it")
    if not job.finished:
        _end(c, job, failed=failed, message=message[: MAX_TEXT * 8], now=now)
    return job


def sweep(c: Cluster, *, now: float) -> None:
    """Attached jobs whose rank 0 said nothing for :data:`SILENCE_S` fail."""
    for job in list(c.state.jobs.values()):
        if job.launcher and not job.finished and now - job.heard_at_unix_s > SILENCE_S:
            silent = now - job.heard_at_unix_s
            text = f"its rank 0 said nothing for {silent:.0f} s (ended by {job.launcher}?)"
            _end(c, job, failed=True, message=text, now=now)


def _end(c: Cluster, job: Job, *, failed: bool, message: str, now: float) -> None:
    job.state = lifecycle.FAILED if failed else lifecycle.SUCCEEDED
    job.finished_at_unix_s, job.message = now, message
    for r in job.ranks:
        r.state = lifecycle.EXITED
    how = f"failed: {message}" if failed else "succeeded"
    c.event("job_detached", f"job {job.name} ({job.launcher}) {how}", now=now, job=job)
    c.save(job)


def from_request(req: pb.AttachJobRequest) -> tuple[JobSpec, str, Attached]:
    """The typed spec, its stored text and the section of an ``AttachJob`` request; a
    request that names no launcher, no ranks, or values the balancer cannot use is a
    ``ConfigError`` naming the field."""
    if not req.ranks or len(req.ranks) > MAX_RANKS:
        raise ConfigError(f"AttachJob: 1 to {MAX_RANKS} ranks, got {len(req.ranks)}")
    for name, text in (("launcher", req.launcher), ("launcher_job_id", req.launcher_job_id)):
        _check_text(f"AttachJob: {name}", text)
    if not req.launcher:
        raise ConfigError("AttachJob: launcher is required (torchrun, slurm, ...)")
    ranks = []
    for i, r in enumerate(req.ranks):
        _check_text(f"AttachJob: rank {i} host", r.host)
        _check_text(f"AttachJob: rank {i} device_name", r.device_name)
        kind = PB_TO_KIND.get(r.device_kind, "cpu")
        score = r.compute_score if r.compute_score > 0 else 1.0
        slowdown = r.emulated_slowdown if r.emulated_slowdown >= 1.0 else 1.0
        if not (math.isfinite(score) and math.isfinite(slowdown)) or score > 1e9:
            raise ConfigError(f"AttachJob: rank {i}: compute_score and slowdown must be finite")
        ranks.append(AttachedRank(r.host, r.device_name, kind, score, slowdown))
    attached = Attached(req.launcher, req.launcher_job_id, tuple(ranks))
    job: dict[str, object] = {
        "name": req.name,
        "command": [req.launcher],
        "global_batch": req.global_batch,
        "policy": req.policy or "dynamic",
        "resources": {"ranks": len(ranks)},
    }
    if req.steps > 0:
        job["steps"] = req.steps
    if req.rebalance_interval > 0:
        job["rebalance_interval"] = req.rebalance_interval
    if req.min_batch > 0:
        job["min_batch"] = req.min_batch
    spec = parse_jobspec(_dump(job), source="AttachJob")
    text = _dump({**job, KEY: _section(attached)})
    return spec, text, attached


def parse_stored(text: str, source: str) -> tuple[JobSpec, Attached | None]:
    """A stored job's spec, and its ``attached:`` section if it has one (written first,
    by :func:`from_request`, so a submitted job's text is parsed once, as it was)."""
    if not text.startswith(f"{KEY}:"):
        return parse_jobspec(text, source=source), None
    raw = yaml.safe_load(text)
    section = raw.pop(KEY)
    attached = Attached(
        section["launcher"],
        section.get("launcher_job_id", ""),
        tuple(AttachedRank(**r) for r in section["ranks"]),
    )
    return parse_jobspec(_dump(raw), source=source), attached


def check_submitted(text: str, source: str) -> None:
    """A job file may not carry ``attached:``: the coordinator writes it for the jobs it
    did not launch."""
    if text.startswith(f"{KEY}:") or f"\n{KEY}:" in text:
        raise ConfigError(f"{source}: {KEY}: is written by AttachJob, not in a job file")


def _section(a: Attached) -> dict[str, object]:
    return {
        "launcher": a.launcher,
        "launcher_job_id": a.launcher_job_id,
        "ranks": [r.__dict__ for r in a.ranks],
    }


def _dump(doc: dict[str, object]) -> str:
    # The section first: ``parse_stored`` tells an attached job's text by its first line.
    keys = sorted(doc, key=lambda k: (k != KEY, k))
    return yaml.safe_dump({k: doc[k] for k in keys}, sort_keys=False, width=1 << 20)


def _check_text(what: str, text: str) -> None:
    if len(text) > MAX_TEXT or not text.isprintable():
        raise ConfigError(
            f"{what}: at most {MAX_TEXT} printable characters, got {json.dumps(text[:40])}"
        )
