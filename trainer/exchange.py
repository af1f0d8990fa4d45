"""Plan exchange at rebalance boundaries: gather stats, decide on rank 0, broadcast.

Every ``rebalance_interval`` steps each rank summarizes its interval into a
fixed-size vector; an all-gather gives every rank everyone's summary; rank 0
asks its planner for the next plan (the embedded policy, or later the agent
and coordinator) and broadcasts ``(changed, version, apply_at_step, plan, comm)``,
``comm`` being the gradient all-reduce mode for the next interval
(``trainer.commsched``). All ranks then schedule the identical plan at the
identical step and switch mode at the same step. Two small collectives per
interval; nothing on the per-step path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from hetero.core import replan
from hetero.core.balancer import (
    Constraints,
    Decision,
    DeviceProfile,
    History,
    Horizon,
    Policy,
    RankInterval,
)
from hetero.trainer.commsched import mode_code, mode_of

#: Order of the fields of one rank's summary vector.
SUMMARY_FIELDS = (
    "batch",
    "steps",
    "compute_s",
    "step_s",
    "data_s",
    "forward_s",
    "backward_s",
    "comm_s",
    "optimizer_s",
    "injected_s",
    "loss_sum",
    "samples",
    "peak_memory_bytes",
    "slowdown",
    "lookahead",
    "switch_s",
    "busy_cv",
    "input_s",
    "input_cv",
)


@dataclass(frozen=True)
class RankSummary:
    """One rank's interval, as exchanged: means per step over the steps at ``batch``."""

    rank: int
    batch: int
    steps: int
    compute_s: float
    step_s: float
    data_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    optimizer_s: float
    injected_s: float
    loss_sum: float  # Σ over the interval's steps of (mean loss × batch)
    samples: int  # samples processed in the interval, every step counted
    peak_memory_bytes: int
    slowdown: float
    #: Steps this rank's sampler had produced beyond the boundary (loader prefetch): a
    #: plan scheduled sooner would reach steps already cut under the old one.
    lookahead: int = 0
    #: Seconds in all that this rank's first steps at a new batch size took beyond its
    #: settled steps; None if its batch did not change in the interval.
    switch_s: float | None = None
    #: Relative spread of the settled steps' busy times (robust); None if too few steps.
    busy_cv: float | None = None
    #: Seconds per step this rank's DataLoader workers need to make a batch of ``batch``
    #: (``trainer.inputrate``); None without workers.
    input_s: float | None = None
    #: Relative spread of those workers' seconds per sample (robust); None without
    #: workers or with too few batches.
    input_cv: float | None = None

    def to_interval(self) -> RankInterval:
        """What the balancer reads: busy time is ``data_s + compute_s + optimizer_s``."""
        return RankInterval(
            rank=self.rank,
            batch=self.batch,
            steps=self.steps,
            compute_s=self.compute_s,
            step_s=self.step_s,
            peak_memory_bytes=self.peak_memory_bytes or None,
            data_s=self.data_s,
            optimizer_s=self.optimizer_s,
            switch_s=self.switch_s,
            busy_cv=self.busy_cv,
            input_s=self.input_s,
            input_cv=self.input_cv,
        )

    def vector(self) -> list[float]:
        # None travels as -1 (every real value is >= 0).
        return [_encode(getattr(self, f)) for f in SUMMARY_FIELDS]

    @classmethod
    def from_vector(cls, rank: int, v: Sequence[float]) -> RankSummary:
        d = dict(zip(SUMMARY_FIELDS, v, strict=True))
        return cls(
            rank=rank,
            batch=int(d["batch"]),
            steps=int(d["steps"]),
            compute_s=d["compute_s"],
            step_s=d["step_s"],
            data_s=d["data_s"],
            forward_s=d["forward_s"],
            backward_s=d["backward_s"],
            comm_s=d["comm_s"],
            optimizer_s=d["optimizer_s"],
            injected_s=d["injected_s"],
            loss_sum=d["loss_sum"],
            samples=int(d["samples"]),
            peak_memory_bytes=int(d["peak_memory_bytes"]),
            slowdown=d["slowdown"],
            lookahead=int(d["lookahead"]),
            switch_s=d["switch_s"] if d["switch_s"] >= 0 else None,
            busy_cv=d["busy_cv"] if d["busy_cv"] >= 0 else None,
            input_s=d["input_s"] if d["input_s"] >= 0 else None,
            input_cv=d["input_cv"] if d["input_cv"] >= 0 else None,
        )


def _encode(value: float | None) -> float:
    return -1.0 if value is None else float(value)


class Planner(Protocol):
    """Where rank 0 gets the next plan from. ``horizon``: how long a new plan would run
    (the pay-back rule's; None if the caller cannot say)."""

    def decide(
        self, history: History, current: tuple[int, ...], horizon: Horizon | None = None
    ) -> Decision: ...


@dataclass(frozen=True)
class EmbeddedPlanner:
    """Runs the balancer policy inside the training process (no control plane)."""

    policy: Policy
    constraints: Constraints
    profiles: Sequence[DeviceProfile] | None = None

    def decide(
        self, history: History, current: tuple[int, ...], horizon: Horizon | None = None
    ) -> Decision:
        return replan.next_plan(
            self.policy, history, current, self.constraints, self.profiles, horizon
        )


def all_gather_summaries(
    mine: RankSummary, world_size: int, device: torch.device
) -> list[RankSummary]:
    """Every rank's summary, in rank order (one all-gather of a small float64 tensor)."""
    if world_size == 1:
        return [mine]
    local = torch.tensor(mine.vector(), dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(gathered, local)
    return [RankSummary.from_vector(r, t.tolist()) for r, t in enumerate(gathered)]


#: ``(changed, version, apply_at_step, plan, recheck_steps)``: rank 0's plan decision at a
#: boundary; ``recheck_steps`` (0: none) settled steps of the new plan after which the
#: ranks exchange again within the interval (``Decision.recheck_steps``).
PlanDecision = tuple[bool, int, int, tuple[int, ...], int]


def broadcast_plan(
    decision: PlanDecision | None,
    comm: str | None,
    world_size: int,
    device: torch.device,
    *,
    entries: int | None = None,
) -> tuple[bool, int, int, tuple[int, ...], int, str]:
    """Rank 0's ``(changed, version, apply_at_step, plan, recheck_steps)`` and comm mode
    on every rank (``decision`` and ``comm`` are read on rank 0 only); the plan has
    ``entries`` batches (default one a rank; pipeline replicas: one a replica)."""
    if world_size == 1:
        assert decision is not None and comm is not None
        return (*decision, comm)
    buf = torch.zeros(5 + (entries or world_size), dtype=torch.int64, device=device)
    if decision is not None and comm is not None:
        changed, version, apply_at, plan, recheck = decision
        buf[0], buf[1], buf[2], buf[3] = int(changed), version, apply_at, mode_code(comm)
        buf[4] = recheck
        buf[5:] = torch.tensor(plan, dtype=torch.int64)
    dist.broadcast(buf, src=0)
    v = buf.tolist()
    plan_ = tuple(int(b) for b in v[5:])
    return bool(v[0]), int(v[1]), int(v[2]), plan_, int(v[4]), mode_of(int(v[3]))
