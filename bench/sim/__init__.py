"""A deterministic, seeded cluster simulator that measures balancer policies.

Imports the balancer (``hetero.core.balancer``); the balancer never
imports this package. Everything here is simulated: no GPU, no torch.
"""

from hetero.bench.sim.engine import IntervalRecord, SimRun, simulate
from hetero.bench.sim.metrics import SimResult, summarize
from hetero.bench.sim.scenario import (
    Scenario,
    Worker,
    known_scenarios,
    load_scenario,
    load_scenario_file,
    parse_scenario,
)

__all__ = [
    "IntervalRecord",
    "Scenario",
    "SimResult",
    "SimRun",
    "Worker",
    "known_scenarios",
    "load_scenario",
    "load_scenario_file",
    "parse_scenario",
    "simulate",
    "summarize",
]
