"""Balancer policies: pure functions from per-rank statistics to batch-size plans.

Nothing here imports grpc, torch or sqlalchemy: the trainer embeds this package
in every training process and the coordinator runs the same code.
"""

from hetero.coordinator.balancer.model import (
    StepModel,
    equal_time_plan,
    fit_step_model,
    predict_step_s,
)
from hetero.coordinator.balancer.plan import Batches, Constraints, equal_batches, round_to_plan
from hetero.coordinator.balancer.policies import (
    POLICIES,
    Decision,
    Dynamic,
    Equal,
    Policy,
    Proportional,
    make_policy,
)
from hetero.coordinator.balancer.stats import DeviceProfile, History, Interval, RankInterval

__all__ = [
    "POLICIES",
    "Batches",
    "Constraints",
    "Decision",
    "DeviceProfile",
    "Dynamic",
    "Equal",
    "History",
    "Interval",
    "Policy",
    "Proportional",
    "RankInterval",
    "StepModel",
    "equal_batches",
    "equal_time_plan",
    "fit_step_model",
    "make_policy",
    "predict_step_s",
    "round_to_plan",
]
