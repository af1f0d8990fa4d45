"""A rank's background input pipeline, as the balancer models it.

A rank whose batches come from DataLoader workers reports the seconds its
workers need for one batch (``RankInterval.input_s``). The pipeline runs beside
the step: it costs nothing while it keeps up and sets the step once it does
not, so a rank's predicted time is the larger of its own work and its input
(``model.StepModel.input_per_sample_s``). Its rate is read from the rank's
newest intervals: the median seconds per sample, robust to one stalled
interval, and that median's relative standard error, which the confidence
tests count where the pipeline is what sets (or nearly sets) the rank's time
(``payback.sigma_at``, ``order.Speeds``). The error is at least what the
intervals' own batches say (``RankInterval.input_noise_floor``): a loader whose
samples take a heavy-tailed time (remote reads, a decoder that sometimes
stalls) measures a rate one interval cannot pin down, and a plan that one such
interval asked for was measured worse and undone at the next.

With each rank's workers fixed for the run (the trainer's loader), a rank's
rate is its share of its node's decoding throughput: moving samples between the
ranks of a node moves decoding work with them, and adds none. The rate is
measured under the node's current load; a plan that moves much of a node's
decoding elsewhere changes that load, which the next intervals measure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

from hetero.core.balancer.robust_fit import RankFit, robust_scale
from hetero.core.balancer.stats import MEDIAN_SE, Interval


def with_input_rates(
    fits: Sequence[RankFit], recent: Sequence[Interval], window: int, default_cv: float
) -> tuple[RankFit, ...]:
    """Each fit with its rank's input pipeline rate: the median seconds per sample of
    its newest ``window`` measured intervals, and that median's relative standard
    error (``default_cv`` for the spread until three intervals give one), at least
    the intervals' own (their median ``input_noise_floor`` over √count). A fit is left
    as it is while the rank's newest interval has no pipeline."""
    out = []
    for rank, fit in enumerate(fits):
        if recent[-1][rank].input_per_sample_s is None:
            out.append(fit)
            continue
        measured = [
            (ri, v)
            for iv in recent
            if (ri := iv[rank]).steps > 0 and (v := ri.input_per_sample_s) is not None
        ][-window:]
        values = [v for _, v in measured]
        rate = statistics.median(values)
        if rate <= 0:
            out.append(fit)
            continue
        cv = robust_scale([v / rate - 1.0 for v in values]) if len(values) >= 3 else None
        spread = default_cv if cv is None else cv
        floors = [f for ri, _ in measured if (f := ri.input_noise_floor) is not None]
        floor = statistics.median(floors) / math.sqrt(len(values)) if floors else 0.0
        sigma = max(MEDIAN_SE * spread / math.sqrt(len(values)), floor)
        model = replace(fit.model, input_per_sample_s=rate)
        out.append(replace(fit, model=model, input_sigma=sigma))
    return tuple(out)
