"""When the gradient all-reduce starts, per interval: a fixed mode, or ``auto`` by measurement.

The two modes are ``trainer.gradients``' ``overlap`` (DDP's schedule) and
``deferred`` (every bucket launched when the step's last one is ready). Neither
wins everywhere: on 2x H100 with a neighbour on one GPU, overlap made the fast
rank's compute grow into its slack (ViT-B/16: 69 -> 79 ms) and hid that slack
from the planner, while deferral exposed the whole all-reduce (~3-4 ms for
~350 MB of fp32 gradients). At an imbalanced plan the slow rank sets the step
in both; at a balanced one, which is faster is a property of the job.

``auto`` (:class:`AutoComm`, rank 0 only, pure) therefore:

1. plans in ``deferred``: the planner sees clean compute, and in ``auto`` only
   deferred intervals enter its history;
2. once the plan has run unchanged for ``settle_intervals`` measured intervals,
   and the planner counts it as settled (``Decision.settled``: no rank's jump
   waiting for confirmation, no move predicted to gain over half of what it
   needs), or has held it for ``patience_intervals`` more whatever it predicts,
   or the deferred intervals expose an all-reduce that overlap may hide worth
   ``worth_share`` of the step, runs one trial interval in ``overlap``. A trial interval never
   reaches the planner, so a trial while the planner still converges takes
   its evidence away: on a loaded 2-core host 11 of 25 intervals were left
   out, and the plan sat far from balanced for 22;
3. compares the trial's step time (the slowest rank's median wall time per
   step) with the median of the deferred intervals at the same plan, and keeps
   overlap only if it is faster by more than ``margin`` and by more than
   ``noise_z`` standard deviations of the deferred intervals' own spread (a
   tie goes to deferred, which keeps the planner's view clean: while overlap
   is kept no interval reaches the planner, and on a host whose intervals
   swing by 10% a 1% margin kept overlap on noise about half the time);
4. goes back to ``deferred`` whenever the plan changes, and, while overlap is
   kept, when the step time moves by more than ``drift`` (a speed change the
   planner has to look at with clean compute); then it settles and tries again.

The mode rank 0 picks travels in the plan broadcast and applies from the step
after the boundary on every rank (``trainer.rebalance``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from hetero.core.catalogue import BY_NAME
from hetero.core.catalogue.limits import COMM_MODES
from hetero.trainer.gradients import DEFERRED, MODES, OVERLAP

AUTO = "auto"
#: What ``comm=`` accepts (``ht.init``, ``ctx.wrap``, ``hetero-train --comm``, job.yaml).
COMM_CHOICES = COMM_MODES
assert set(COMM_CHOICES) == {AUTO, *MODES}


def check_comm(choice: str) -> str:
    """``choice`` if it is one of :data:`COMM_CHOICES`; else a ``ConfigError`` naming them
    (the catalogue's check, as for ``ht.init(comm=...)``)."""
    checked: str = BY_NAME["comm"].check(choice)
    return checked


def mode_code(mode: str) -> int:
    """The mode as an integer for the plan broadcast."""
    return MODES.index(mode)


def mode_of(code: int) -> str:
    return MODES[code]


@dataclass(frozen=True)
class CommRecord:
    """A change of comm mode as every rank applied it: from global step ``step`` on."""

    step: int
    mode: str
    reason: str


class CommPolicy(Protocol):
    """Rank 0's choice of mode for the next interval, from the interval just ended.

    ``batches``: the per-rank batch sizes the interval was measured at (None if a
    rank measured no step); ``step_s``: the slowest rank's median step time (s);
    ``plan_changed``: whether a new plan was scheduled at this boundary;
    ``settled``: whether the planner counts the plan as settled.
    """

    def next_mode(
        self,
        batches: tuple[int, ...] | None,
        step_s: float | None,
        plan_changed: bool,
        *,
        settled: bool = True,
        hideable_s: float | None = None,
    ) -> tuple[str, str]: ...


@dataclass(frozen=True)
class FixedComm:
    """Always ``mode`` (``comm="overlap"`` or ``"deferred"``)."""

    mode: str

    def next_mode(
        self,
        batches: tuple[int, ...] | None,
        step_s: float | None,
        plan_changed: bool,
        *,
        settled: bool = True,
        hideable_s: float | None = None,
    ) -> tuple[str, str]:
        return self.mode, f"{self.mode} (fixed)"


class Phase(Enum):
    SETTLING = "settling"  # deferred, counting intervals at one plan
    TRIAL = "trial"  # one interval in overlap
    OVERLAP = "overlap kept"
    DEFERRED = "deferred kept"


@dataclass
class AutoComm:
    """``comm="auto"``: deferred to plan, a trial of overlap once the plan settles
    (see the module doc). ``margin`` and ``drift`` are fractions of the step time."""

    settle_intervals: int = 2
    #: Intervals beyond ``settle_intervals`` that a held plan waits for the planner to
    #: count it as settled; then the trial runs anyway. A move predicted near its
    #: threshold that has not crossed it in that many intervals is not coming, and
    #: each deferred interval pays the whole all-reduce: two nodes over a 2 Gbit/s
    #: link (ResNet-50, 2x H200) held +0.6% predicted against 1.0% needed for 7
    #: intervals, deferred, at 0.89x plain DDP, where overlap would have won.
    patience_intervals: int = 3
    #: Share of the deferred step that the all-reduce overlap may hide (``hideable_s``:
    #: the slowest rank's exposed all-reduce, at most its backward) above which the
    #: trial does not wait for the planner to settle: deferral costs that much every
    #: step, more than the sub-threshold moves the planner may still be weighing.
    worth_share: float = 0.10
    margin: float = 0.01
    drift: float = 0.10
    #: Newest deferred intervals whose median is the reference for the trial.
    reference_intervals: int = 3
    #: Standard deviations of the intervals' noise a trial must beat the reference by.
    noise_z: float = 2.0
    phase: Phase = Phase.SETTLING
    plan: tuple[int, ...] | None = None
    deferred_s: list[float] = field(default_factory=list)
    kept_s: float = 0.0

    def next_mode(
        self,
        batches: tuple[int, ...] | None,
        step_s: float | None,
        plan_changed: bool,
        *,
        settled: bool = True,
        hideable_s: float | None = None,
    ) -> tuple[str, str]:
        if plan_changed:
            self._settle(None)
            return DEFERRED, "plan changed: deferred until it settles"
        measured = batches is not None and step_s is not None and step_s > 0
        same = measured and batches == self.plan
        if self.phase is Phase.TRIAL:
            return self._verdict(step_s if same else None)
        if self.phase is Phase.OVERLAP:
            if (
                same
                and step_s is not None
                and abs(step_s - self.kept_s) <= self.drift * self.kept_s
            ):
                return OVERLAP, "overlap kept"
            moved = f"{self.kept_s * 1e3:.1f} -> {step_s * 1e3:.1f} ms" if step_s else "unmeasured"
            self._settle(batches if measured else None)
            return DEFERRED, f"step time moved in overlap ({moved}): deferred to re-plan"
        if self.phase is Phase.DEFERRED:
            return DEFERRED, "deferred kept"
        if not measured or step_s is None:
            return DEFERRED, "deferred: waiting for a measured interval"
        if not same:
            self._settle(batches)
        self.deferred_s.append(step_s)
        n = len(self.deferred_s)
        if n < self.settle_intervals:
            return DEFERRED, f"deferred: plan settling ({n}/{self.settle_intervals} intervals)"
        waited = n >= self.settle_intervals + self.patience_intervals
        worth = hideable_s is not None and hideable_s >= self.worth_share * step_s
        if not settled and not waited and not worth:
            return DEFERRED, "deferred: the planner may still move the plan (no trial yet)"
        self.phase = Phase.TRIAL
        held = ""
        if not settled:
            held = (
                f", overlap may hide {hideable_s * 1e3:.1f} ms of the all-reduce a step"
                if worth and hideable_s is not None
                else ", the planner's pending move not made"
            )
        return OVERLAP, (
            f"trial of overlap: plan unchanged for {n} intervals{held}, "
            f"deferred step {self._reference() * 1e3:.1f} ms"
        )

    def _verdict(self, trial_s: float | None) -> tuple[str, str]:
        reference = self._reference()
        if trial_s is None:
            self._settle(self.plan)
            return DEFERRED, "overlap trial inconclusive (plan moved or unmeasured): deferred"
        versus = f"overlap {trial_s * 1e3:.1f} ms vs deferred {reference * 1e3:.1f} ms per step"
        if trial_s < reference * (1.0 - max(self.margin, self._noise())):
            self.phase, self.kept_s = Phase.OVERLAP, trial_s
            return OVERLAP, f"overlap kept: {versus}"
        self.phase = Phase.DEFERRED
        return DEFERRED, f"deferred kept: {versus}"

    def _noise(self) -> float:
        """Relative gain a trial needs beyond noise: ``noise_z`` standard deviations of a
        trial's difference from the reference, from the spread of the deferred
        intervals at this plan (0 from fewer than two)."""
        ref = self.deferred_s[-self.reference_intervals :]
        if len(ref) < 2:
            return 0.0
        cv = statistics.stdev(ref) / statistics.fmean(ref)
        return self.noise_z * cv * math.sqrt(1.0 + 1.0 / len(ref))

    def _reference(self) -> float:
        return statistics.median(self.deferred_s[-self.reference_intervals :])

    def _settle(self, plan: tuple[int, ...] | None) -> None:
        self.phase, self.plan, self.deferred_s, self.kept_s = Phase.SETTLING, plan, [], 0.0


def comm_policy(choice: str) -> CommPolicy:
    """The policy for ``comm=choice``."""
    return AutoComm() if check_comm(choice) == AUTO else FixedComm(choice)
