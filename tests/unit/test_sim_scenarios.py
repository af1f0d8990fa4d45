"""Scenario files: shipped with the package, parsed strictly, errors name the field."""

from __future__ import annotations

import pytest

from hetero.bench.sim import known_scenarios, load_scenario, parse_scenario
from hetero.core.errors import ConfigError

MINIMAL = """
global_batch: 64
steps: 40
rebalance_every: 20
workers:
  - {name: gpu, count: 3, per_sample_s: 0.001}
"""


def test_the_issue_s_scenarios_ship_with_the_package_and_load() -> None:
    names = set(known_scenarios())
    assert {
        "two-workers",
        "four-workers",
        "eight-workers",
        "sixty-four-workers",
        "mixed-generations",
        "fixed-cost-heavy",
        "noise-5pct",
        "neighbour",
        "memory-capped",
        "calibration-resnet50",
    } <= names
    for name in names:
        assert load_scenario(name).workers
    assert len(load_scenario("sixty-four-workers").workers) == 64


def test_count_expands_into_uniquely_named_workers() -> None:
    scenario = parse_scenario("minimal", MINIMAL)
    assert [w.name for w in scenario.workers] == ["gpu-0", "gpu-1", "gpu-2"]


def test_unknown_key_is_an_error_naming_it_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"workers\[0\]: unknown key 'per_sample'.*per_sample_s"):
        parse_scenario("bad", MINIMAL.replace("per_sample_s", "per_sample"))


def test_a_wrongly_typed_value_is_an_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="global_batch: expected an integer"):
        parse_scenario("bad", MINIMAL.replace("global_batch: 64", "global_batch: lots"))


def test_unknown_scenario_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown scenario 'neighbor'.*did you mean 'neighbour'"):
        load_scenario("neighbor")


def test_a_measured_curve_cannot_take_a_separate_fixed_factor() -> None:
    text = """
    global_batch: 64
    steps: 40
    rebalance_every: 20
    workers:
      - name: m
        curve: [{batch: 32, step_s: 0.02}, {batch: 64, step_s: 0.03}]
        changes: [{at_step: 10, per_sample_factor: 2.0, fixed_factor: 0.5}]
    """
    with pytest.raises(ConfigError, match="per_sample_factor only"):
        parse_scenario("bad", text)
