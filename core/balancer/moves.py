"""From fitted step models to the next plan, and whether to move to it at all.

The measurement-driven policies fit each rank (``dynamic.py``) and then
decide here, in this order:

0. **First move after a change** (``first_move_bound``): a rank whose speed
   changed at the newest interval is taken as proportional through that
   interval, so the move goes toward equal measured busy time and no further
   than one interval can tell.
1. **Trust region** (``trust.py``): each rank's bounds for the next plan,
   within a factor of the batches its current regime has run; a rank whose
   speed just changed is free.
2. **Equal busy time** (``model.equal_time_plan``) within those bounds, on a
   grid of sizes (``grid.py``).
3. **Order** (``order.py``): no rank confidently slower than another, as
   known with or before the newest interval, holds more samples.
4. **Warm shapes** (``grid.snap_to_warm``): the same plan moved onto sizes
   the ranks ran recently, as a second candidate.
5. **Pay-back** (``payback.py``): a candidate is adopted only if its
   predicted gain beats the noise of the fits and the dead-band, and the part
   of the gain beyond that threshold (what the job is confident to win) over
   the coming intervals beats the measured cost of switching shapes; of those
   that qualify, the largest net gain wins. Otherwise the plan is kept.

A current plan that breaks the constraints or the confident order is
replaced whatever the gain. Keeping the plan unless a move is clearly
better is the hysteresis: noise of either sign around an optimum that the
grid or the integers cannot hit exactly moves nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero.core.balancer.decision import Decision
from hetero.core.balancer.grid import grid_step, snap_to_warm, warm_shapes
from hetero.core.balancer.model import StepModel, equal_time_plan, predict_step_s
from hetero.core.balancer.order import SpeedOrder
from hetero.core.balancer.payback import Horizon, gain_threshold, switch_costs
from hetero.core.balancer.plan import Batches, Box, Constraints
from hetero.core.balancer.robust_fit import CONFIRM_NOISE, RankFit
from hetero.core.balancer.stats import History
from hetero.core.balancer.trust import trust_box
from hetero.core.errors import PlanError

#: A move whose predicted gain is this many times its threshold rests on one interval even
#: on a noisy host (an emulated 3x rank, a neighbour's arrival); a smaller one there
#: waits for the next interval to confirm it (``confirmed``).
STRONG_EVIDENCE = 2.0
#: Share of its threshold a kept plan's best move may predict and the plan still count
#: as settled (``Decision.settled``): a gain of half the noise is a move a few more
#: intervals may well confirm.
SETTLED_SHARE = 0.5


@dataclass(frozen=True)
class MoveRules:
    """The knobs of the decision (``Dynamic``'s fields of the same names)."""

    dead_band: float
    trust_factor: float
    confidence_z: float
    default_cv: float
    payback_intervals: int
    switch_prior_steps: float
    grid: int
    recheck_steps: int = 0


@dataclass(frozen=True)
class _Candidate:
    batches: Batches
    step_s: float
    gain: float  # relative to the current plan's predicted step
    threshold: float  # relative gain needed to count as real
    cost_s: float  # switching cost, seconds
    net_s: float  # the confident gain over the horizon minus the cost, seconds


def propose(
    models: Sequence[StepModel], fits: Sequence[RankFit], constraints: Constraints, rules: MoveRules
) -> tuple[Batches, Box]:
    """The equal-busy-time plan within the trust region, on the grid, and its bounds."""
    box = trust_box(fits, constraints, factor=rules.trust_factor)
    free = equal_time_plan(models, constraints, box)
    g = rules.grid or grid_step(free)
    return (equal_time_plan(models, constraints, box, g) if g > 1 else free), box


def decide(
    history: History,
    current: Batches,
    constraints: Constraints,
    models: Sequence[StepModel],
    fits: Sequence[RankFit],
    order: SpeedOrder,
    rules: MoveRules,
    horizon: Horizon | None = None,
) -> Decision:
    """The decision from ``current`` given the fitted ``models`` (see the module doc)."""
    changed_ranks = [r for r, f in enumerate(fits) if f.changed_at_newest]
    pending = [r for r, f in enumerate(fits) if f.pending]
    note = f"; speed change on rank(s) {changed_ranks}" if changed_ranks else ""
    # A move on one point of a new speed is measured at once, within the interval.
    recheck = rules.recheck_steps if changed_ranks else 0
    if pending:
        note += f"; rank(s) {pending} jumped, waiting for the next interval to confirm"
    models = first_move_bound(models, fits, current)
    proposed, box = propose(models, fits, constraints, rules)
    proposed = order.enforce(proposed, box)
    t_new = predict_step_s(models, proposed, comm_s=constraints.comm_s)
    try:
        constraints.check(current)
    except PlanError as exc:
        reason = f"current plan invalid ({exc}){note}"
        return Decision(proposed, True, reason, t_new, models, settled=False, recheck_steps=recheck)
    t_now = predict_step_s(models, current, comm_s=constraints.comm_s)
    inverted = order.violations(current, settled=True)
    if inverted and not order.violations(proposed):
        slower = ", ".join(f"{j} slower than {i}" for i, j in inverted)
        reason = f"order: rank {slower} held more samples{note}"
        moved = proposed != tuple(current)
        return Decision(
            proposed,
            moved,
            reason,
            t_new,
            models,
            settled=not moved and not pending,
            recheck_steps=recheck if moved else 0,
        )

    shapes = warm_shapes(history)
    busy_now = [m.time(b) for m, b in zip(models, current, strict=True)]
    costs = switch_costs(history, busy_now, prior_steps=rules.switch_prior_steps)
    steps = (horizon or _default_horizon(history)).steps(rules.payback_intervals)
    options = [proposed]
    snapped = snap_to_warm(proposed, shapes, constraints, box)
    if snapped is not None:
        options.append(order.enforce(snapped, box))
    candidates = []
    for batches in dict.fromkeys(options):  # unique, in order
        if batches == tuple(current) or order.violations(batches):
            continue
        step_s = predict_step_s(models, batches, comm_s=constraints.comm_s)
        gain = (t_now - step_s) / t_now
        threshold = max(
            rules.dead_band,
            gain_threshold(
                models,
                fits,
                current,
                batches,
                z=rules.confidence_z,
                default_cv=rules.default_cv,
            ),
        )
        cost = costs.of(current, batches, shapes)
        # The gain it is sure of, beyond its noise threshold, pays for the switch.
        net = (gain - threshold) * t_now * steps - cost
        candidates.append(_Candidate(batches, step_s, gain, threshold, cost, net))
    if not candidates:
        return Decision(
            tuple(current),
            False,
            f"plan is the equal-time plan{note}",
            t_now,
            models,
            settled=not pending,
        )
    real = [c for c in candidates if c.gain > c.threshold]
    paying = [c for c in real if c.net_s > 0]
    if paying:
        best = max(
            paying,
            key=lambda c: (c.net_s, -sum(c.batches[i] != current[i] for i in range(len(current)))),
        )
        strong = best.gain >= STRONG_EVIDENCE * best.threshold
        if noisy(fits) and not strong and not confirmed(order, current, best):
            reason = (
                f"a gain of {best.gain:.1%} (> {best.threshold:.1%}) on a noisy host, waiting "
                f"for the next interval to confirm it{note}"
            )
            return Decision(tuple(current), False, reason, t_now, models, settled=False)
        reason = (
            f"predicted step {t_now * 1e3:.1f} -> {best.step_s * 1e3:.1f} ms "
            f"(gain {best.gain:.1%} > {best.threshold:.1%}; pays {best.cost_s * 1e3:.0f} ms "
            f"switch in {steps} steps){note}"
        )
        return Decision(
            best.batches, True, reason, best.step_s, models, settled=False, recheck_steps=recheck
        )
    top = max(candidates, key=lambda c: c.gain)
    # A real gain that does not pay for its switch stays unpaid while the horizon shrinks:
    # the plan is as settled as one within the noise.
    settled = not pending and (bool(real) or top.gain <= SETTLED_SHARE * top.threshold)
    if not real:
        reason = (
            f"within dead-band and noise ({top.gain:+.1%} predicted, "
            f"needs > {top.threshold:.1%}){note}"
        )
    else:
        top = max(real, key=lambda c: c.net_s)
        reason = (
            f"does not pay back ({(top.gain - top.threshold) * t_now * 1e3:.2f} ms/step "
            f"beyond the noise x {steps} steps < {top.cost_s * 1e3:.0f} ms switch){note}"
        )
    return Decision(tuple(current), False, reason, t_now, models, settled=settled)


def noisy(fits: Sequence[RankFit]) -> bool:
    """Whether any rank's intervals vary by ``CONFIRM_NOISE`` or more (a CPU rank on a
    host whose cores other work takes, a loaded shared host): there one interval's
    numbers are not yet evidence for a move short of ``STRONG_EVIDENCE``. Only measured
    noise counts: a job's first report, without its steps' spread, is not yet known to be
    noisy, and its first move rests on it as on a quiet host's."""
    return any(
        f.noise_measured and f.noise_cv is not None and f.noise_cv >= CONFIRM_NOISE for f in fits
    )


def confirmed(order: SpeedOrder, current: Sequence[int], move: _Candidate) -> bool:
    """Whether what was known before the newest interval (``order.before``: the fits
    without it) predicts the same move's gain beyond its threshold too. Where intervals
    are noisy, a move needs two intervals that agree: one interval in which a CPU rank
    lost its core for a while (a 2-core host running two ranks beside other work)
    moved alike ranks to 9/23 and back within three intervals."""
    before = order.before
    if before is None:
        return False
    t_now = max(m.time(b) for m, b in zip(before.models, current, strict=True))
    t_new = max(m.time(b) for m, b in zip(before.models, move.batches, strict=True))
    return t_now > 0 and (t_now - t_new) / t_now > move.threshold


def first_move_bound(
    models: Sequence[StepModel], fits: Sequence[RankFit], current: Sequence[int]
) -> tuple[StepModel, ...]:
    """The models with each rank whose speed changed at the newest interval made
    proportional through that interval's point (``t = (t₀/b₀)·b``).

    One interval at a new speed is one point: every fixed cost from 0 to the
    whole step time fits it (``changepoint``), and the fixed cost carried over
    from the rank's earlier regime is no evidence for the new one (a neighbour
    that time-slices a GPU adds to every kernel; one that leaves takes it away).
    Of all the models the point allows, the proportional one moves the least
    (it has the largest per-sample cost), and the direction of its move, toward
    equal measured busy time, holds for any of them. So the first move after a
    change goes that far and no further; the second point, at the new plan,
    measures the split (``robust_fit``: two levels of one regime) for the next.
    Carried over, a fixed cost of 48 ms that a departing neighbour took with it
    made a GPU at 43 ms per step look nearly free per sample, and the plan went
    from 364/148 to 174/338 when 256/256 was right.
    """
    out = []
    for m, f, b in zip(models, fits, current, strict=True):
        if f.changed_at_newest and b > 0 and m.fixed_s > 0:
            m = StepModel(m.work(b) / b, 0.0, m.input_per_sample_s)
        out.append(m)
    return tuple(out)


def _default_horizon(history: History) -> Horizon:
    """Without a horizon from the caller: intervals as long as the newest one measured."""
    steps = max((ri.steps for ri in history[-1]), default=1) if history else 1
    return Horizon(max(steps, 1))
