"""Policies: the trainer-facing API, configuration errors, dead-band, changes, hybrid prior."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hetero.core.balancer import (
    Constraints,
    DeviceProfile,
    Dynamic,
    Hybrid,
    RankInterval,
    StepModel,
    equal_time_plan,
    estimate_comm_s,
    make_policy,
    predict_step_s,
)
from hetero.core.errors import ConfigError, PlanError

Models = Sequence[StepModel]


def interval(
    models: Models,
    plan: Sequence[int],
    scale: Sequence[float] | None = None,
    busy_cv: float = 0.01,
):
    """One interval of 20 steps at ``plan``, each rank's time scaled by ``scale``; its steps
    spread by ``busy_cv`` (1%: a quiet GPU; the trainer reports it)."""
    scale = scale or [1.0] * len(models)
    return tuple(
        RankInterval(r, plan[r], 20, m.time(plan[r]) * scale[r], busy_cv=busy_cv)
        for r, m in enumerate(models)
    )


def run(policy, models: Models, constraints: Constraints, intervals: int, plan=None):
    """Drive a policy for some noise-free intervals; return (plans, decisions)."""
    plan = plan or policy.initial(constraints)
    history, plans, decisions = [], [plan], []
    for _ in range(intervals):
        history.append(interval(models, plan))
        d = policy.next_plan(history, plan, constraints)
        decisions.append(d)
        plan = d.batches
        plans.append(plan)
    return plans, decisions, history


def test_make_policy_builds_each_named_policy_with_parameters() -> None:
    assert make_policy("equal").name == "equal"
    assert make_policy("proportional").name == "proportional"
    assert make_policy("dynamic", dead_band=0.05) == Dynamic(dead_band=0.05)
    assert make_policy("hybrid", prior_cv=0.5) == Hybrid(prior_cv=0.5)


def test_unknown_policy_or_parameter_is_a_config_error_with_a_hint() -> None:
    with pytest.raises(ConfigError, match="did you mean 'dynamic'"):
        make_policy("dynamik")
    with pytest.raises(ConfigError, match="did you mean 'dead_band'"):
        make_policy("dynamic", deadband=0.1)


@pytest.mark.parametrize(
    "params",
    [{"window": 0}, {"recency": 0.0}, {"dead_band": 1.0}, {"window": 9, "history_window": 8}],
)
def test_dynamic_rejects_bad_configuration(params: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Dynamic(**params)  # type: ignore[arg-type]


def test_dynamic_reaches_the_equal_time_plan_of_affine_ranks_with_fixed_costs() -> None:
    models = [StepModel(0.0001, 0.060), StepModel(0.0004, 0.002)]
    constraints = Constraints(512, 2)
    plans, _, _ = run(Dynamic(), models, constraints, 8)
    target = equal_time_plan(models, constraints)
    assert abs(plans[-1][0] - target[0]) <= 2


def test_dynamic_keeps_its_plan_when_the_gain_is_inside_the_dead_band() -> None:
    models = [StepModel(0.0003, 0.008)] * 4
    constraints = Constraints(1024, 4)
    plan = (256, 256, 256, 256)
    history = [interval(models, plan, [1.0, 1.004, 0.997, 1.0]) for _ in range(5)]
    decision = Dynamic(grid=1).next_plan(history, plan, constraints)
    assert not decision.changed
    assert decision.batches == plan
    assert "dead-band" in decision.reason


def test_dynamic_re_plans_in_one_interval_after_a_rank_slows_suddenly() -> None:
    models = [StepModel(0.0003, 0.008)] * 4
    constraints = Constraints(1024, 4)
    policy = Dynamic()
    plans, _, history = run(policy, models, constraints, 5)
    slowed = [StepModel(0.0003, 0.008)] * 3 + [StepModel(0.00045, 0.008)]
    history.append(interval(slowed, plans[-1]))
    decision = policy.next_plan(history, plans[-1], constraints)
    assert decision.changed and "speed change on rank(s) [3]" in decision.reason
    best = predict_step_s(slowed, equal_time_plan(slowed, constraints))
    # No spread in batches before the change, so c is unknown: within 5% of optimal.
    assert predict_step_s(slowed, decision.batches) <= 1.05 * best


def test_predicted_step_time_includes_the_all_reduce_cost() -> None:
    models = [StepModel(0.0003, 0.008)] * 2
    history = [interval(models, (128, 128))]
    compute_only = Dynamic().next_plan(history, (128, 128), Constraints(256, 2))
    with_comm = Dynamic().next_plan(history, (128, 128), Constraints(256, 2, comm_s=0.01))
    assert with_comm.predicted_step_s == pytest.approx(compute_only.predicted_step_s + 0.01)


def test_estimate_comm_s_is_the_median_wall_time_beyond_the_slowest_compute() -> None:
    history = [
        (RankInterval(0, 128, 20, 0.050, 0.058), RankInterval(1, 128, 20, 0.040, 0.058)),
        (RankInterval(0, 128, 20, 0.050, 0.059), RankInterval(1, 128, 20, 0.040, 0.059)),
        (RankInterval(0, 128, 20, 0.050, 0.150), RankInterval(1, 128, 20, 0.040, 0.150)),
    ]
    assert estimate_comm_s(history) == pytest.approx(0.009)
    assert estimate_comm_s([(RankInterval(0, 1, 1, 0.1),)]) == 0.0


def test_a_current_plan_that_breaks_new_memory_caps_is_replaced() -> None:
    models = [StepModel(0.0003, 0.008)] * 2
    history = [interval(models, (128, 128))]
    capped = Constraints(256, 2, max_batch=(100, None))
    decision = Dynamic().next_plan(history, (128, 128), capped)
    assert decision.changed and decision.batches[0] <= 100


def test_negative_comm_s_is_a_plan_error() -> None:
    with pytest.raises(PlanError):
        Constraints(256, 2, comm_s=-1.0)


def test_hybrid_starts_from_the_compute_scores() -> None:
    profiles = [DeviceProfile("h100", 3.0), DeviceProfile("l4", 1.0)]
    assert Hybrid().initial(Constraints(400, 2), profiles) == (300, 100)


def test_hybrid_follows_clean_measurements_over_a_wrong_prior() -> None:
    # The profiles say the ranks are equal; a neighbour makes rank 1 2.5x slower.
    models = [StepModel(0.0002, 0.009), StepModel(0.0005, 0.009)]
    profiles = [DeviceProfile("h200", 1.0), DeviceProfile("h200", 1.0)]
    constraints = Constraints(512, 2)
    policy, plan, history = Hybrid(), (256, 256), []
    for _ in range(3):
        history.append(interval(models, plan))
        plan = policy.next_plan(history, plan, constraints, profiles).batches
    best = predict_step_s(models, equal_time_plan(models, constraints))
    assert predict_step_s(models, plan) <= 1.02 * best


def test_hybrid_leans_on_the_prior_when_measurements_are_noisy() -> None:
    prior_right = [DeviceProfile("a", 2.0), DeviceProfile("b", 1.0)]
    models = [StepModel(0.0002, 0.0), StepModel(0.0004, 0.0)]
    # Noise in the ranks' relative speed (the load both ranks share is divided out).
    noise = [[1.0, 1.0], [1.0, 1.3], [1.0, 0.75], [1.0, 1.25]]
    history = [interval(models, (256, 256), n, busy_cv=0.3) for n in noise]
    policy = Hybrid(prior_cv=0.05)
    hybrid_models = policy.models(history, prior_right)[0]
    dynamic_models = Dynamic().fit(history)
    ratio = hybrid_models[1].per_sample_s / hybrid_models[0].per_sample_s
    raw = dynamic_models[1].per_sample_s / dynamic_models[0].per_sample_s
    assert abs(ratio - 2.0) < abs(raw - 2.0)
