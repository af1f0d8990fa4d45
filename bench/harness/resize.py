"""A scenario as one ``hetero-bench run`` runs it: ``--quick``, ``--steps``, ``--ideal-steps``,
``--policies`` and ``--no-baseline`` applied to the file's scenario (pure, no torch).

``--steps`` rescales the change steps (a neighbour's arrival, an emulated
slowdown's window) to keep their fraction of the run, on rebalance boundaries.
"""

from __future__ import annotations

from dataclasses import replace

from hetero.bench.harness.scenario import check_changes, policy_list
from hetero.bench.harness.scenariospec import Scenario
from hetero.core.errors import ConfigError


def _scale_step(step: int | None, factor: float, interval: int) -> int | None:
    """``step`` scaled by ``factor``, on a rebalance boundary, at least one interval in."""
    if step is None:
        return None
    return max(interval, round(step * factor / interval) * interval)


def resize(scenario: Scenario, steps: int) -> Scenario:
    """The scenario with ``steps`` total steps; change steps keep their fraction of the run."""
    if steps < 2 * scenario.rebalance_interval:
        raise ConfigError(
            f"--steps must be at least two rebalance intervals "
            f"({2 * scenario.rebalance_interval}) for {scenario.name}, got {steps}"
        )
    f = steps / scenario.steps
    k = scenario.rebalance_interval
    neighbours = tuple(
        replace(
            n,
            arrive_step=_scale_step(n.arrive_step, f, k),
            leave_step=_scale_step(n.leave_step, f, k),
        )
        for n in scenario.neighbours
    )
    slowdowns = tuple(
        replace(
            s,
            start=(_scale_step(s.start, f, k) or 0) if s.start > 0 else 0,
            end=_scale_step(s.end, f, k),
        )
        for s in scenario.slowdowns
    )
    overrides = tuple(
        (name, replace(o, steps=max(2 * k, round(o.steps * f)) if o.steps else None))
        for name, o in scenario.overrides
    )
    out = replace(
        scenario, steps=steps, neighbours=neighbours, slowdowns=slowdowns, overrides=overrides
    )
    check_changes(out)
    return out


def configure(
    scenario: Scenario,
    *,
    quick: bool = False,
    steps: int | None = None,
    ideal_steps: int | None = None,
    policies: tuple[str, ...] | None = None,
    baseline: bool | None = None,
) -> Scenario:
    """Apply ``--quick`` (the file's ``quick:`` block), then explicit flags, which win."""
    s = scenario
    if quick:
        if s.quick_steps is not None:
            s = resize(s, s.quick_steps)
        if s.quick_ideal_steps is not None:
            s = replace(s, ideal_steps=s.quick_ideal_steps)
        if s.quick_policies is not None:
            s = replace(s, policies=s.quick_policies)
        if s.quick_data_paths is not None:
            s = replace(s, data_paths=s.quick_data_paths)
        if s.quick_repeats is not None:
            s = replace(s, repeats=s.quick_repeats)
        if s.quick_num_workers is not None:
            s = replace(s, num_workers=s.quick_num_workers)
    if steps is not None:
        s = resize(s, steps)
    if ideal_steps is not None:
        if ideal_steps < 0:
            raise ConfigError(f"--ideal-steps must be >= 0, got {ideal_steps}")
        s = replace(s, ideal_steps=ideal_steps)
    if policies is not None:
        s = replace(s, policies=policy_list(policies, "--policies"))
    if baseline is not None:
        s = replace(s, baseline=baseline)
    return s
