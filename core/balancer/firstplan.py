"""What hardware profiles and measured links predict before a job has measured anything:
the predictions a submission shows, and whether its first plan leaves equal batches.

**Units.** A profile model gives rank *i* the step time ``b / score_i``, with
``score_i`` its device's matmul TFLOP/s (divided by any emulated slowdown): the
units of the scores, which compare plans but are not seconds. The all-reduce over
the measured links between the job's nodes is seconds
(:func:`~hetero.core.balancer.allreduce.link_comm_s`). A sample whose forward and
backward pass take ``F`` FLOPs (the catalogue's ``train_flops``) takes
``F / (score · 1e12)`` seconds at the matmul rate, which the models count as
``1 / score``: one second is ``1e12 / F`` of their units
(:func:`comm_in_score_units`). Where ``F`` is unknown (a ``command:`` job) the
all-reduce is left out, as before the links were measured.

**Which way it errs.** The compute is at the devices' matmul rate, which no model
reaches (a lower bound), and the all-reduce is not overlapped with the backward
pass as DDP overlaps it (an upper bound): the all-reduce's share of a step is
overstated, so the rule below errs toward equal batches, plain DDP's plan.

**The first plan** (``communication_bound``). The all-reduce delays every rank
alike, so it never moves a split; it shrinks what a split gains relative to the
step. Where the plan a policy makes from the profiles (``proportional``, and
``hybrid``'s prior) gains at least the dynamic planner's dead band
(``Dynamic.dead_band``, 1%) over equal batches on compute alone, but less once the
all-reduce is counted, the job starts at equal batches and the plan's reason says
why ("communication-bound: ..."): a split of that size is within what the
do-no-harm guard (``guard``) calls noise, and its first intervals at the profiles'
split would be spent to learn so. A plan that gains under the dead band on compute
alone is kept as the policy made it (devices alike: it is equal or nearly).
"""

from __future__ import annotations

from collections.abc import Sequence

from hetero.core.balancer.dynamic import Dynamic
from hetero.core.balancer.model import StepModel, predict_step_s
from hetero.core.balancer.plan import Batches

#: FLOPs in one TFLOP: compute scores are TFLOP/s.
TFLOP = 1e12
#: The smallest relative gain in predicted step time worth a plan other than equal.
DEAD_BAND = Dynamic.dead_band


def profile_models(scores: Sequence[float]) -> list[StepModel]:
    """Step models ``t_i(b) = b / score_i`` in score units (module doc)."""
    return [StepModel(per_sample_s=1.0 / max(score, 1e-9)) for score in scores]


def comm_in_score_units(comm_s: float, train_flops: float) -> float:
    """``comm_s`` seconds in the units of :func:`profile_models`, for samples of
    ``train_flops`` FLOPs each (module doc); 0 where ``train_flops`` is unknown (0)."""
    return comm_s * TFLOP / train_flops if train_flops > 0 else 0.0


def communication_bound(
    proposed: Batches,
    equal: Batches,
    models: Sequence[StepModel],
    comm: float,
    *,
    comm_s: float,
    dead_band: float = DEAD_BAND,
) -> str:
    """Why the first plan should be ``equal`` rather than the ``proposed`` one (module
    doc), in a user's words; "" where it should not. ``comm``: the all-reduce in the
    models' units; ``comm_s``: the same in seconds, for the words."""
    if tuple(proposed) == tuple(equal) or comm <= 0:
        return ""
    compute_gain = 1.0 - predict_step_s(models, proposed) / predict_step_s(models, equal)
    t_equal = predict_step_s(models, equal, comm_s=comm)
    gain = 1.0 - predict_step_s(models, proposed, comm_s=comm) / t_equal
    if compute_gain < dead_band or gain >= dead_band:
        return ""
    return (
        f"communication-bound: the profiles' split {list(proposed)} would shorten the "
        f"compute by {compute_gain:.1%} but a step by {gain:.1%} once the all-reduce over "
        f"the measured links ({comm_s * 1e3:.1f} ms/step, {comm / t_equal:.0%} of a step) "
        f"is counted, under the {dead_band:.0%} a new plan must gain: equal split (plain DDP)"
    )
