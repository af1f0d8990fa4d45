"""Balancer policies: pure functions from per-rank statistics to batch-size plans.

Nothing here imports grpc, torch or sqlalchemy: the trainer embeds this package
in every training process and the coordinator runs the same code.
"""

from hetero.core.balancer.allreduce import Link, all_reduce_s, link_comm_s, ring_all_reduce_s
from hetero.core.balancer.changepoint import Regime, find_regimes
from hetero.core.balancer.decision import Decision, Policy
from hetero.core.balancer.dynamic import Dynamic, Hybrid
from hetero.core.balancer.exclusion import ExclusionRule
from hetero.core.balancer.grid import grid_step, snap_to_warm, warm_shapes
from hetero.core.balancer.model import (
    StepModel,
    equal_time_plan,
    fit_step_model,
    predict_step_s,
)
from hetero.core.balancer.order import SpeedOrder, Speeds
from hetero.core.balancer.payback import Horizon, SwitchCosts, switch_costs
from hetero.core.balancer.plan import Batches, Box, Constraints, equal_batches, round_to_plan
from hetero.core.balancer.policies import POLICIES, Equal, Proportional, make_policy
from hetero.core.balancer.robust_fit import RankFit, fit_rank
from hetero.core.balancer.stats import (
    DeviceProfile,
    History,
    Interval,
    RankInterval,
    estimate_comm_s,
)
from hetero.core.balancer.straggler import (
    ExclusionForecast,
    StragglerDetector,
    StragglerEvidence,
    detect_stragglers,
    predict_exclusion,
)
from hetero.core.balancer.trust import trust_box

__all__ = [
    "POLICIES",
    "Batches",
    "Box",
    "Constraints",
    "Decision",
    "DeviceProfile",
    "Dynamic",
    "Equal",
    "ExclusionForecast",
    "ExclusionRule",
    "History",
    "Horizon",
    "Hybrid",
    "Interval",
    "Link",
    "Policy",
    "Proportional",
    "RankFit",
    "RankInterval",
    "Regime",
    "SpeedOrder",
    "Speeds",
    "StepModel",
    "StragglerDetector",
    "StragglerEvidence",
    "SwitchCosts",
    "all_reduce_s",
    "detect_stragglers",
    "equal_batches",
    "equal_time_plan",
    "estimate_comm_s",
    "find_regimes",
    "fit_rank",
    "fit_step_model",
    "grid_step",
    "link_comm_s",
    "make_policy",
    "predict_exclusion",
    "predict_step_s",
    "ring_all_reduce_s",
    "round_to_plan",
    "snap_to_warm",
    "switch_costs",
    "trust_box",
    "warm_shapes",
]
