"""The uneven-batch sampler: one seeded global order per epoch, cut by the plan.

Every rank builds the same permutation of the dataset for epoch ``e`` from
``seed`` and ``e``. Step ``k`` of the epoch takes the next ``B`` indices of that
permutation and cuts them by the plan's cumulative sizes: rank ``r`` gets
``perm[start + Σ_{j<r} b_j : start + Σ_{j≤r} b_j]``. A plan change at any step
therefore neither drops nor duplicates a sample, and a resumed run continues
the same order from the saved position.

The tail of an epoch (``N mod B`` samples) forms one short final step, cut in
proportion to the plan, when it gives every rank at least ``min_batch``
samples; otherwise it is dropped (and ``dropped_per_epoch`` says how many).
Pass ``drop_last=True`` to always drop it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hetero.core.balancer import Constraints, round_to_plan
from hetero.core.errors import ConfigError, PlanError


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> list[int]:
    """The global order of epoch ``epoch``: identical on every rank and every run."""
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + epoch) % (2**63 - 1))
    return torch.randperm(num_samples, generator=g).tolist()


@dataclass
class PlanSchedule:
    """Plans keyed by the global step from which they apply (ascending)."""

    starts: list[int] = field(default_factory=lambda: [0])
    plans: list[tuple[int, ...]] = field(default_factory=list)

    def at(self, step: int) -> tuple[int, ...]:
        return self.plans[bisect.bisect_right(self.starts, step) - 1]

    def add(self, apply_at_step: int, plan: tuple[int, ...]) -> None:
        if apply_at_step < self.starts[-1]:
            raise PlanError(
                f"plan for step {apply_at_step} arrives after one for step {self.starts[-1]}"
            )
        if apply_at_step == self.starts[-1]:
            self.plans[-1] = plan
        else:
            self.starts.append(apply_at_step)
            self.plans.append(plan)

    def drop_after(self, step: int) -> None:
        """Forget the plans scheduled for steps after ``step`` (superseded)."""
        keep = max(bisect.bisect_right(self.starts, step), 1)
        del self.starts[keep:]
        del self.plans[keep:]

    def prune(self, before_step: int) -> None:
        """Forget plans wholly superseded before ``before_step`` (keeps the list short)."""
        keep = max(bisect.bisect_right(self.starts, before_step) - 1, 0)
        del self.starts[:keep]
        del self.plans[:keep]


class PlannedSampler:
    """What the samplers of both data paths share: the plans by step, and the first
    global step not yet cut (every step before it was handed to the loader's source
    under the plan then in force, so a plan may only change from it on)."""

    def __init__(self, plan: Sequence[int], rank: int) -> None:
        if not 0 <= rank < len(plan):
            raise ConfigError(f"rank {rank} outside a plan of {len(plan)} ranks")
        self.global_batch = sum(plan)
        self.rank = rank
        self.schedule = PlanSchedule(plans=[tuple(plan)])
        self.global_step = 0

    def set_plan(self, plan: Sequence[int], apply_at_step: int) -> None:
        if apply_at_step < self.global_step:
            # The loader already drew indices for that step under the old plan:
            # the caller scheduled the change closer than the prefetch depth.
            raise PlanError(
                f"plan for step {apply_at_step} arrives after the sampler produced step "
                f"{self.global_step - 1}; schedule it at least the loader's prefetch depth ahead"
            )
        if sum(plan) != self.global_batch:
            raise PlanError(
                f"plan {list(plan)} does not sum to the global batch {self.global_batch}"
            )
        self.schedule.add(apply_at_step, tuple(plan))


class UnevenBatchSampler(PlannedSampler):
    """Yields, per step, this rank's list of dataset indices under the current plan.

    Usable as a ``batch_sampler`` of ``torch.utils.data.DataLoader``. The plan is
    changed with :meth:`set_plan` naming the global step from which it applies;
    a loader that prefetches must schedule it at least its prefetch depth ahead.
    """

    def __init__(
        self,
        num_samples: int,
        plan: Sequence[int],
        rank: int,
        *,
        seed: int = 0,
        min_batch: int = 1,
        drop_last: bool = False,
    ) -> None:
        if num_samples < 1:
            raise ConfigError("the dataset is empty")
        super().__init__(plan, rank)
        if self.global_batch > num_samples:
            raise ConfigError(
                f"global batch {self.global_batch} is larger than the dataset "
                f"({num_samples} samples)"
            )
        self.num_samples = num_samples
        self.seed = seed
        self.min_batch = min_batch
        self.drop_last = drop_last
        self.epoch = 0
        self.step_in_epoch = 0
        self._perm: list[int] | None = None
        self._perm_epoch = -1

    # -- arithmetic ------------------------------------------------------------------
    @property
    def tail(self) -> int:
        return self.num_samples % self.global_batch

    @property
    def has_short_step(self) -> bool:
        world = len(self.schedule.plans[-1])
        return not self.drop_last and self.tail >= self.min_batch * world

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.global_batch + (1 if self.has_short_step else 0)

    @property
    def dropped_per_epoch(self) -> int:
        return 0 if self.has_short_step else self.tail

    def batches_at(self, step_in_epoch: int, global_step: int) -> tuple[int, ...]:
        """Per-rank batch sizes of a step: the plan, or its cut of the short final step."""
        return self.cut(self.schedule.at(global_step), step_in_epoch)

    def cut(self, plan: tuple[int, ...], step_in_epoch: int) -> tuple[int, ...]:
        """Per-rank sizes of step ``step_in_epoch`` under ``plan`` (the tail step's share)."""
        if step_in_epoch < self.num_samples // self.global_batch:
            return plan
        constraints = Constraints(self.tail, len(plan), min_batch=self.min_batch)
        return round_to_plan([float(b) for b in plan], constraints)

    def _permutation(self, epoch: int) -> list[int]:
        if self._perm_epoch != epoch:
            self._perm = epoch_permutation(self.num_samples, self.seed, epoch)
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm

    def indices(self, epoch: int, step_in_epoch: int, global_step: int) -> list[list[int]]:
        """Every rank's indices of one step (all ranks compute the same cut)."""
        batches = self.batches_at(step_in_epoch, global_step)
        perm = self._permutation(epoch)
        start = step_in_epoch * self.global_batch
        out = []
        for b in batches:
            out.append(perm[start : start + b])
            start += b
        return out

    # -- iteration -------------------------------------------------------------------
    def current_batches(self) -> tuple[int, ...]:
        """Per-rank sizes of the step the sampler will yield next."""
        return self.batches_at(self.step_in_epoch, self.global_step)

    def __len__(self) -> int:
        return self.steps_per_epoch - self.step_in_epoch

    def __iter__(self) -> Iterator[list[int]]:
        """The rest of the current epoch, from the saved position; then the next epoch."""
        epoch = self.epoch
        while self.epoch == epoch and self.step_in_epoch < self.steps_per_epoch:
            idx = self.indices(self.epoch, self.step_in_epoch, self.global_step)[self.rank]
            self.step_in_epoch += 1
            self.global_step += 1
            yield idx
        if self.step_in_epoch >= self.steps_per_epoch:
            self.epoch += 1
            self.step_in_epoch = 0

    # -- checkpointing ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "seed": self.seed,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "schedule_starts": list(self.schedule.starts),
            "schedule_plans": [list(p) for p in self.schedule.plans],
        }

    def load_state_dict(self, state: dict[str, Any], plans: bool = True) -> None:
        """Restore the position in the global order; with ``plans`` also the plan
        schedule (same world size only). Without, this sampler's current plan
        applies from the restored step: the order of samples is global, so a run
        with another number of ranks continues it all the same."""
        if state["num_samples"] != self.num_samples or state["seed"] != self.seed:
            raise ConfigError(
                f"checkpoint sampler is for {state['num_samples']} samples / seed {state['seed']}, "
                f"this run has {self.num_samples} / {self.seed}"
            )
        if not plans:
            self.epoch = int(state["epoch"])
            self.step_in_epoch = int(state["step_in_epoch"])
            self.global_step = int(state["global_step"])
            self.schedule = PlanSchedule(starts=[0], plans=[self.schedule.plans[-1]])
            return
        plans_ = [tuple(int(b) for b in p) for p in state["schedule_plans"]]
        if any(len(p) != len(self.schedule.plans[-1]) for p in plans_):
            raise ConfigError(
                f"checkpoint plan has {len(plans_[-1])} ranks, this run has "
                f"{len(self.schedule.plans[-1])}"
            )
        self.epoch = int(state["epoch"])
        self.step_in_epoch = int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])
        self.schedule = PlanSchedule(
            starts=[int(s) for s in state["schedule_starts"]], plans=plans_
        )
