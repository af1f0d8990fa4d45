"""When a job should run without a rank: the rule the coordinator acts on.

``straggler.predict_exclusion`` forecasts the throughput of the equal-time plan
with and without a rank, the global batch unchanged. This module decides when
such a forecast is evidence enough to act on, in two situations:

- **From measurements** (a running job, or its restart): the per-rank step
  models are fitted on the job's own intervals (``Dynamic().fit``), the exposed
  all-reduce estimated from wall versus busy time (``estimate_comm_s``). Only a
  rank flagged as a straggler is a candidate, and the forecast must say
  "worthwhile" (gain above ``min_gain``) for the same rank on each of the newest
  ``consecutive`` intervals: a restart costs the steps since the last checkpoint
  and a new rendezvous, so one noisy interval must never cause one.
- **From hardware profiles** (before anything is measured; the coordinator
  only reports it, in ``submit --dry-run``): per-sample time ``1 / score`` with no fixed cost and no all-reduce,
  because scores are relative speeds without a unit of time and cannot be weighed
  against a communication time in seconds. Under that model dropping a rank can
  only help when ``min_batch`` forces a rank so slow that its smallest batch
  takes longer than the others' whole step; that is the only case it excludes.
  Leaving out what profiles cannot know (fixed costs, the all-reduce) can only
  understate the gain, so a profile decision errs toward keeping the rank.

A job of one rank is never shrunk (``predict_exclusion`` needs a rank left).
Pure: no grpc, torch or sqlalchemy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetero.core.balancer.dynamic import Dynamic
from hetero.core.balancer.model import StepModel
from hetero.core.balancer.plan import Constraints
from hetero.core.balancer.stats import History, estimate_comm_s
from hetero.core.balancer.straggler import (
    ExclusionForecast,
    StragglerDetector,
    predict_exclusion,
)
from hetero.core.errors import ConfigError, HeteroError

#: Smallest forecast gain worth a restart (``predict_exclusion``'s default margin).
MIN_GAIN = 0.05
#: Newest intervals in a row whose forecast must agree before a running job restarts.
CONSECUTIVE = 3
#: Fewest intervals one measured forecast is fitted on (a fit on one interval has no
#: fixed cost to speak of: every batch size in it is the same).
MIN_INTERVALS = 2


@dataclass(frozen=True)
class ExclusionRule:
    """``min_gain``: forecast gain required (0.05 = 5% more samples/s without the rank);
    ``consecutive``: newest intervals whose measured forecasts must all agree."""

    min_gain: float = MIN_GAIN
    consecutive: int = CONSECUTIVE
    detector: StragglerDetector = field(default_factory=StragglerDetector)

    def __post_init__(self) -> None:
        if not self.min_gain >= 0.0:
            raise ConfigError(f"exclusion min_gain must be >= 0, got {self.min_gain}")
        if self.consecutive < 1:
            raise ConfigError(f"exclusion consecutive must be >= 1, got {self.consecutive}")

    def best(
        self,
        models: Sequence[StepModel],
        constraints: Constraints,
        candidates: Sequence[int],
        kinds: Sequence[str] | None = None,
    ) -> ExclusionForecast | None:
        """The worthwhile forecast with the largest gain over ``candidates`` (one rank
        left out each), or None when none clears ``min_gain``."""
        if constraints.world_size < 2:
            return None
        forecasts = [
            predict_exclusion(models, constraints, r, min_gain=self.min_gain, kinds=kinds)
            for r in candidates
        ]
        worthwhile = [f for f in forecasts if f.worthwhile]
        return max(worthwhile, key=lambda f: f.gain) if worthwhile else None

    def measured(
        self, history: History, constraints: Constraints, kinds: Sequence[str] | None = None
    ) -> ExclusionForecast | None:
        """The newest interval's forecast for a straggler the job is faster without, when
        the forecasts of the newest ``consecutive`` intervals (each on the history up to
        it) all leave out that same rank; else None."""
        world = constraints.world_size
        if world < 2 or len(history) < MIN_INTERVALS + self.consecutive - 1:
            return None
        flagged = [e.rank for e in self.detector.detect(history)]
        if not flagged:
            return None  # the common case, without a fit
        chosen: ExclusionForecast | None = None
        for back in range(self.consecutive):
            upto = history[: len(history) - back]
            if any(len(iv) != world for iv in upto[-MIN_INTERVALS:]):
                return None
            try:
                models = Dynamic().fit(upto)
                measured = dataclasses.replace(constraints, comm_s=estimate_comm_s(upto))
                forecast = self.best(models, measured, flagged, kinds)
            except HeteroError:
                return None
            if forecast is None or (chosen is not None and forecast.rank != chosen.rank):
                return None
            chosen = chosen or forecast  # the newest interval's numbers are the ones shown
        return chosen

    def from_profiles(
        self, scores: Sequence[float], constraints: Constraints
    ) -> ExclusionForecast | None:
        """A start-time forecast from relative compute scores (larger = faster): leaves
        out the slowest rank only if even ``min_batch`` samples hold the others back by
        more than ``min_gain`` (see the module doc)."""
        if constraints.world_size < 2 or len(scores) != constraints.world_size:
            return None
        if any(not s > 0 for s in scores):
            return None
        models = [StepModel(per_sample_s=1.0 / s) for s in scores]
        slowest = min(range(len(scores)), key=lambda r: (scores[r], -r))
        try:
            return self.best(models, dataclasses.replace(constraints, comm_s=0.0), [slowest])
        except HeteroError:
            return None
