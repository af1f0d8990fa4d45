"""Benchmark scenarios for ``hetero-bench run``: typed, validated, loaded from YAML.

A scenario names the ranks and their devices, the job (model, global batch,
precision, steps, rebalance interval), the loop that trains it (``builtin``:
``hetero-train`` and ``bench/baseline_ddp.py``; ``zoo``: a user's script through
the API and the same loop in plain DDP, ``bench/zoo/``, under torchrun, once per
data path: ``loader``, ``jpeg`` or ``device``, and on the DataLoader paths once
per worker count of ``num_workers``), which runs to make (the plain-DDP
baseline, hetero's policies, a GPU-alone reference; ``repeats`` times each, in
alternating pairs) and the heterogeneity: a noisy neighbour on a GPU (present
all run, or arriving and leaving at given steps), emulated slowdowns on CPU
ranks, an input pipeline's jitter or an EMULATED per-sample input cost
(``bench/zoo/delays.py``). ``targets`` say what the runs must show
(``harness.targets``). Files live in ``bench/scenarios/``
(the simulator's are under ``scenarios/sim/``). Parsed once into frozen
dataclasses; an unknown key or bad value raises ``ConfigError`` naming the
file and field. The dataclasses themselves are ``scenariospec``'s.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

import yaml

from hetero.bench.harness.scenariospec import (
    BASELINE,
    DEVICES,
    GPU_ONLY,
    LOOPS,
    POLICIES,
    Neighbour,
    RunOverride,
    Scenario,
    Slowdown,
)
from hetero.bench.harness.targets import parse_targets
from hetero.bench.shipped import shipped_names, shipped_text
from hetero.bench.zoo import DATA_PATHS, LOADER_PATHS, parse_sides
from hetero.bench.zoo.delays import parse_input_cost, parse_jitter
from hetero.core.errors import ConfigError

# -- loading ---------------------------------------------------------------------------


def known_scenarios() -> list[str]:
    """Names of the shipped ``run`` scenarios (``bench/scenarios/*.yaml``), sorted."""
    return shipped_names("scenarios")


def load_scenario(name: str) -> Scenario:
    """The shipped scenario called ``name``; ``ConfigError`` naming the known ones if none."""
    return parse_scenario(name, shipped_text("scenarios", name))


_TOP = {
    "description",
    "devices",
    "ranks",
    "gpus",
    "model",
    "global_batch",
    "steps",
    "rebalance_interval",
    "ideal_steps",
    "image_size",
    "num_classes",
    "num_samples",
    "amp",
    "channels_last",
    "lr",
    "min_batch",
    "dataset",
    "seq_len",
    "policies",
    "baseline",
    "gpu_only_reference",
    "neighbour",
    "neighbours",
    "slowdowns",
    "overrides",
    "quick",
    "run_timeout_s",
    "loop",
    "data_paths",
    "num_workers",
    "shard",
    "memory_fraction",
    "activation_checkpointing",
    "offload",
    "repeats",
    "loader_jitter",
    "input_cost_ms",
    "jpeg_sides",
    "targets",
}
_QUICK = {"steps", "ideal_steps", "policies", "data_paths", "repeats", "num_workers"}


def _unknown_keys(where: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")


def _choices(values: Any, known: tuple[str, ...], what: str, where: str) -> tuple[str, ...]:
    """``values`` as a tuple, each one of ``known``; ``what`` is "singular/plural"."""
    one, many = what.split("/")
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(f"{where}: expected a non-empty list of {many}")
    for v in values:
        if v not in known:
            raise ConfigError(f"{where}: unknown {one} {v!r} (known: {', '.join(known)})")
    return tuple(str(v) for v in values)


def policy_list(values: Any, where: str) -> tuple[str, ...]:
    return _choices(values, POLICIES, "policy/policies", where)


def _data_paths(values: Any, where: str) -> tuple[str, ...]:
    return _choices(values, DATA_PATHS, "data path/data paths", where)


def parse_scenario(name: str, text: str) -> Scenario:
    """Parse one scenario file's text; errors name ``name`` and the field."""
    where = f"scenario {name}"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    _unknown_keys(where, data, _TOP)
    for key in _REQUIRED:
        if key not in data:
            raise ConfigError(f"{where}: missing key {key!r}")
    kw: dict[str, Any] = {k: v for k, v in data.items() if k not in _NESTED}
    try:
        if "policies" in data:
            kw["policies"] = policy_list(data["policies"], f"{where}.policies")
        if "data_paths" in data:
            kw["data_paths"] = _data_paths(data["data_paths"], f"{where}.data_paths")
        if data.get("neighbour") is not None and data.get("neighbours") is not None:
            raise ConfigError(f"{where}: give either neighbour or neighbours, not both")
        if data.get("neighbour") is not None:
            nb = data["neighbour"]
            kw["neighbours"] = (Neighbour(**_checked(nb, Neighbour, f"{where}.neighbour")),)
        elif data.get("neighbours") is not None:
            if not isinstance(data["neighbours"], list):
                raise ConfigError(f"{where}.neighbours: expected a list of neighbours")
            kw["neighbours"] = tuple(
                Neighbour(**_checked(nb, Neighbour, f"{where}.neighbours[{i}]"))
                for i, nb in enumerate(data["neighbours"])
            )
        kw["slowdowns"] = tuple(
            Slowdown(**_checked(s, Slowdown, f"{where}.slowdowns"))
            for s in data.get("slowdowns", [])
        )
        kw["overrides"] = tuple(
            (str(run), RunOverride(**_checked(o, RunOverride, f"{where}.overrides.{run}")))
            for run, o in (data.get("overrides") or {}).items()
        )
        if "num_workers" in data:
            kw["num_workers"] = _workers(data["num_workers"], f"{where}.num_workers")
        kw["targets"] = parse_targets(data.get("targets"), f"{where}.targets")
        quick = data.get("quick") or {}
        _unknown_keys(f"{where}.quick", quick, _QUICK)
        kw["quick_steps"] = quick.get("steps")
        kw["quick_ideal_steps"] = quick.get("ideal_steps")
        kw["quick_repeats"] = quick.get("repeats")
        if "num_workers" in quick:
            kw["quick_num_workers"] = _workers(quick["num_workers"], f"{where}.quick.num_workers")
        if "policies" in quick:
            kw["quick_policies"] = policy_list(quick["policies"], f"{where}.quick.policies")
        if "data_paths" in quick:
            kw["quick_data_paths"] = _data_paths(quick["data_paths"], f"{where}.quick.data_paths")
        scenario = Scenario(name=name, **kw)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    _validate(scenario)
    return scenario


_REQUIRED = ("devices", "ranks", "gpus", "model", "global_batch", "steps")
_NESTED = {
    "policies",
    "neighbour",
    "neighbours",
    "slowdowns",
    "overrides",
    "quick",
    "data_paths",
    "num_workers",
    "targets",
}


def _workers(value: Any, where: str) -> tuple[int, ...]:
    """A worker count or a list of them (each a variant), each >= 0, none twice."""
    counts = value if isinstance(value, list) else [value]
    if not counts or any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in counts):
        raise ConfigError(f"{where}: expected a count >= 0 or a list of them, got {value!r}")
    if len(set(counts)) < len(counts):
        raise ConfigError(f"{where}: a count is listed twice in {value!r}")
    return tuple(counts)


def _checked(data: Any, cls: type, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping")
    _unknown_keys(where, data, {f.name for f in dataclasses.fields(cls)})
    return data


def _validate(s: Scenario) -> None:
    where = f"scenario {s.name}"
    if s.devices not in DEVICES:
        raise ConfigError(
            f"{where}.devices: expected one of {', '.join(DEVICES)}, got {s.devices!r}"
        )
    if s.shard not in ("none", "grad_op", "full"):
        raise ConfigError(f"{where}.shard: expected none, grad_op or full, got {s.shard!r}")
    if s.shard != "none" and (s.baseline or s.loop != "builtin"):
        raise ConfigError(
            f"{where}.shard: needs baseline: false and the builtin loop (plain DDP cannot shard)"
        )
    if s.offload not in ("none", "params"):
        raise ConfigError(f"{where}.offload: expected none or params, got {s.offload!r}")
    if s.offload != "none" and s.shard == "none":
        raise ConfigError(f"{where}.offload: needs shard (FSDP2 offloads sharded state)")
    for field in ("ranks", "global_batch", "steps", "rebalance_interval", "min_batch"):
        if int(getattr(s, field)) < 1:
            raise ConfigError(f"{where}.{field}: must be >= 1, got {getattr(s, field)}")
    if s.amp not in ("none", "bf16"):
        raise ConfigError(f"{where}.amp: expected none or bf16, got {s.amp!r}")
    if s.devices == "cpu" and s.gpus:
        raise ConfigError(f"{where}.gpus: a cpu scenario uses no GPU, got {s.gpus}")
    if s.devices != "cpu" and s.gpus < 1:
        raise ConfigError(f"{where}.gpus: a {s.devices} scenario needs at least one GPU")
    if s.devices == "cuda" and s.gpus != s.ranks:
        raise ConfigError(
            f"{where}: a cuda scenario has one rank per GPU ({s.ranks} ranks, {s.gpus} GPUs)"
        )
    if s.devices == "mixed" and s.ranks <= s.gpus:
        raise ConfigError(f"{where}: a mixed scenario needs CPU ranks beyond its {s.gpus} GPU(s)")
    if s.slowdowns and s.devices != "cpu":
        raise ConfigError(f"{where}.slowdowns: emulated slowdowns are for CPU scenarios only")
    for n in s.neighbours:
        if not 0 <= n.gpu < s.gpus:
            raise ConfigError(f"{where}.neighbour.gpu: {n.gpu} is not one of {s.gpus} GPU(s)")
        if not 0.0 < n.duty <= 1.0:
            raise ConfigError(f"{where}.neighbour.duty: must be in (0, 1], got {n.duty}")
    if len({n.gpu for n in s.neighbours}) < len(s.neighbours):
        raise ConfigError(f"{where}.neighbours: at most one neighbour per GPU")
    if s.gpu_only_reference and s.devices != "mixed":
        raise ConfigError(f"{where}.gpu_only_reference: only for mixed GPU+CPU scenarios")
    if s.loop not in LOOPS:
        raise ConfigError(f"{where}.loop: expected one of {', '.join(LOOPS)}, got {s.loop!r}")
    if s.loop == "builtin" and s.data_paths != ("device",):
        raise ConfigError(f"{where}.data_paths: the builtin loop gathers on the device only")
    if s.loop == "zoo" and s.devices == "mixed":
        raise ConfigError(f"{where}.loop: zoo scenarios run on cpu or cuda ranks, not mixed")
    if s.repeats < 1 or (s.quick_repeats is not None and s.quick_repeats < 1):
        raise ConfigError(f"{where}.repeats: must be >= 1, got {s.repeats}")
    checks = (
        ("loader_jitter", parse_jitter),
        ("input_cost_ms", parse_input_cost),
        ("jpeg_sides", parse_sides),
    )
    for field, parse in checks:
        spec = getattr(s, field)
        if spec is None:
            continue
        try:
            parse(str(spec))
        except ConfigError as exc:
            raise ConfigError(f"{where}.{field}: {exc}") from None
        if s.loop != "zoo" or not set(s.data_paths) & set(LOADER_PATHS):
            raise ConfigError(
                f"{where}.{field}: acts in DataLoader workers: needs the zoo loop and a data "
                f"path of {', '.join(LOADER_PATHS)}"
            )
    for run, _ in s.overrides:
        if run not in (*POLICIES, BASELINE, GPU_ONLY):
            raise ConfigError(f"{where}.overrides: unknown run {run!r}")
    for sd in s.slowdowns:
        if not 0 <= sd.rank < s.ranks:
            raise ConfigError(f"{where}.slowdowns: rank {sd.rank} is not in a {s.ranks}-rank job")
    check_changes(s)


def check_changes(s: Scenario) -> None:
    for n in s.neighbours:
        _check_neighbour_changes(s, n)


def _check_neighbour_changes(s: Scenario, n: Neighbour) -> None:
    if n.arrive_step is None:
        if n.leave_step is not None:
            raise ConfigError(f"scenario {s.name}.neighbour: leave_step needs arrive_step")
        return
    if not 0 < n.arrive_step < s.steps:
        raise ConfigError(
            f"scenario {s.name}.neighbour.arrive_step: must be inside the run (1..{s.steps - 1}), "
            f"got {n.arrive_step}"
        )
    if n.leave_step is not None and not n.arrive_step < n.leave_step < s.steps:
        raise ConfigError(
            f"scenario {s.name}.neighbour.leave_step: must be after arrive_step and before "
            f"step {s.steps}, got {n.leave_step}"
        )
