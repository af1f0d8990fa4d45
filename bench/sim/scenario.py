"""Simulator scenarios: typed, validated, loaded from YAML files in ``bench/scenarios/sim/``.

A scenario is a cluster (workers with step-time models, noise, drift, sudden
changes, memory caps), a job (global batch, steps, rebalance interval, per-step
all-reduce cost) and a seed. Everything is parsed once into frozen dataclasses;
an unknown key or bad value raises ``ConfigError`` naming the file and field.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from hetero.bench.shipped import shipped_names, shipped_text
from hetero.core.errors import ConfigError

#: Scenario files shipped with the package (``hetero.bench`` package data).
SCENARIO_DIR = "scenarios/sim"


@dataclass(frozen=True)
class Change:
    """From ``at_step`` on, the worker's base times are scaled by these factors.

    Factors are absolute (relative to the base model), not cumulative: a
    neighbour that leaves is a change back to 1.0.
    """

    at_step: int
    per_sample_factor: float = 1.0
    fixed_factor: float = 1.0
    label: str = ""


@dataclass(frozen=True)
class Drift:
    """Slow drift (thermal throttling): times scale by ``1 + (factor − 1)·(1 − e^(−s/tau))``."""

    factor: float
    tau_steps: float


@dataclass(frozen=True)
class CurvePoint:
    """One measured point: median step seconds and coefficient of variation at a batch."""

    batch: int
    step_s: float
    cv: float = 0.0


@dataclass(frozen=True)
class Worker:
    """One simulated rank.

    Its noise-free compute time at batch b is ``per_sample_s·b + fixed_s``, or,
    when ``curve`` is given, the piecewise-linear interpolation of measured
    points (extended linearly beyond them). Per-step noise is log-normal with
    coefficient of variation ``noise_cv`` (or the curve's interpolated cv).
    ``compute_score`` is what the hardware profile would report (what
    ``proportional`` uses); it defaults to ``1 / per_sample_s``.
    ``max_batch`` is the memory cap in samples. ``switch_s`` is what the first
    step at a batch size the worker never ran costs on top (allocator growth,
    kernel selection), ``warm_switch_s`` what a size it ran before costs.

    ``input_per_sample_s`` (0: none) gives the rank a background input pipeline
    (DataLoader workers) that needs that many seconds per sample to make a batch;
    its step is the larger of its compute and its input. ``input_jitter_cv`` is
    the log-normal spread of one batch's input time (disk, network storage,
    images of varying size); a batch that comes late is waited for.
    """

    name: str
    per_sample_s: float = 0.0
    fixed_s: float = 0.0
    curve: tuple[CurvePoint, ...] = ()
    compute_score: float | None = None
    max_batch: int | None = None
    noise_cv: float | None = None
    drift: Drift | None = None
    changes: tuple[Change, ...] = ()
    switch_s: float = 0.0
    warm_switch_s: float = 0.0
    input_per_sample_s: float = 0.0
    input_jitter_cv: float = 0.0


@dataclass(frozen=True)
class Scenario:
    """A cluster, a job and a seed: everything one simulated run needs."""

    name: str
    description: str
    global_batch: int
    steps: int
    rebalance_every: int
    workers: tuple[Worker, ...]
    min_batch: int = 1
    comm_s: float = 0.0
    noise_cv: float = 0.0
    seed: int = 0
    settle_intervals: int = 3
    #: Interval-level noise (a shared host's load): each rank's times over one interval
    #: scaled by its own log-normal factor, and all ranks' by one shared factor.
    interval_noise_cv: float = 0.0
    shared_noise_cv: float = 0.0

    @property
    def change_steps(self) -> tuple[int, ...]:
        """Steps at which any worker changes suddenly, ascending, without duplicates."""
        return tuple(sorted({c.at_step for w in self.workers for c in w.changes}))


def known_scenarios() -> list[str]:
    """Names of the shipped scenarios (file names without ``.yaml``), sorted."""
    return shipped_names(SCENARIO_DIR)


def load_scenario(name: str) -> Scenario:
    """The shipped scenario called ``name``; ``ConfigError`` naming the known ones if none."""
    return parse_scenario(name, shipped_text(SCENARIO_DIR, name))


def load_scenario_file(path: Path) -> Scenario:
    """A scenario from any YAML file; its name is the file's stem."""
    return parse_scenario(path.stem, path.read_text())


def parse_scenario(name: str, text: str) -> Scenario:
    """Parse and validate one scenario document."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"scenario {name}: not valid YAML: {exc}") from None
    where = f"scenario {name}"
    doc = _mapping(raw, where)
    _only(doc, where, _SCENARIO_KEYS)
    workers_raw = doc.get("workers")
    if not isinstance(workers_raw, list) or not workers_raw:
        raise ConfigError(f"{where}: 'workers' must be a non-empty list")
    workers: list[Worker] = []
    for k, item in enumerate(workers_raw):
        workers.extend(_workers(_mapping(item, f"{where}: workers[{k}]"), f"{where}: workers[{k}]"))
    scenario = Scenario(
        name=name,
        description=str(doc.get("description", "")),
        global_batch=_int(doc, "global_batch", where, required=True, low=1),
        steps=_int(doc, "steps", where, required=True, low=1),
        rebalance_every=_int(doc, "rebalance_every", where, required=True, low=1),
        workers=tuple(workers),
        min_batch=_int(doc, "min_batch", where, default=1, low=1),
        comm_s=_float(doc, "comm_s", where, default=0.0, low=0.0),
        noise_cv=_float(doc, "noise_cv", where, default=0.0, low=0.0),
        seed=_int(doc, "seed", where, default=0, low=0),
        settle_intervals=_int(doc, "settle_intervals", where, default=3, low=0),
        interval_noise_cv=_float(doc, "interval_noise_cv", where, default=0.0, low=0.0),
        shared_noise_cv=_float(doc, "shared_noise_cv", where, default=0.0, low=0.0),
    )
    if scenario.global_batch < scenario.min_batch * len(workers):
        raise ConfigError(f"{where}: global_batch is smaller than min_batch x workers")
    return scenario


_SCENARIO_KEYS = (
    "description",
    "global_batch",
    "steps",
    "rebalance_every",
    "workers",
    "min_batch",
    "comm_s",
    "noise_cv",
    "seed",
    "settle_intervals",
    "interval_noise_cv",
    "shared_noise_cv",
)
_WORKER_KEYS = (
    "input_per_sample_s",
    "input_jitter_cv",
    "name",
    "count",
    "per_sample_s",
    "fixed_s",
    "curve",
    "compute_score",
    "max_batch",
    "noise_cv",
    "drift",
    "changes",
    "switch_s",
    "warm_switch_s",
)


def _workers(doc: Mapping[str, Any], where: str) -> list[Worker]:
    """One entry expands to ``count`` identical workers named ``name-0``, ``name-1``, ..."""
    _only(doc, where, _WORKER_KEYS)
    name = str(doc.get("name", "worker"))
    count = _int(doc, "count", where, default=1, low=1)
    curve = tuple(_curve(doc.get("curve"), f"{where}.curve")) if "curve" in doc else ()
    if curve and ("per_sample_s" in doc or "fixed_s" in doc):
        raise ConfigError(f"{where}: give either 'curve' or 'per_sample_s'/'fixed_s', not both")
    per_sample_s = _float(doc, "per_sample_s", where, default=0.0, low=0.0)
    if not curve and per_sample_s <= 0:
        raise ConfigError(f"{where}.per_sample_s: needs a value > 0 (or give a 'curve')")
    score = doc.get("compute_score")
    if score is not None:
        score = _float(doc, "compute_score", where, low=0.0)
    drift = None
    if doc.get("drift") is not None:
        d = _mapping(doc["drift"], f"{where}.drift")
        _only(d, f"{where}.drift", ("factor", "tau_steps"))
        drift = Drift(
            _float(d, "factor", f"{where}.drift", required=True, low=0.0),
            _float(d, "tau_steps", f"{where}.drift", required=True, low=1e-9),
        )
    changes = []
    for k, item in enumerate(doc.get("changes") or []):
        cw = f"{where}.changes[{k}]"
        c = _mapping(item, cw)
        _only(c, cw, ("at_step", "per_sample_factor", "fixed_factor", "label"))
        changes.append(
            Change(
                _int(c, "at_step", cw, required=True, low=0),
                _float(c, "per_sample_factor", cw, default=1.0, low=1e-9),
                _float(c, "fixed_factor", cw, default=1.0, low=0.0),
                str(c.get("label", "")),
            )
        )
    changes.sort(key=lambda c: c.at_step)
    if curve and any(c.fixed_factor != 1.0 for c in changes):
        # A measured curve has no per-sample/fixed split to scale separately.
        raise ConfigError(f"{where}.changes: a 'curve' worker takes per_sample_factor only")
    max_batch = doc.get("max_batch")
    base = Worker(
        name=name,
        per_sample_s=per_sample_s,
        fixed_s=_float(doc, "fixed_s", where, default=0.0, low=0.0),
        curve=curve,
        compute_score=score,
        max_batch=None if max_batch is None else _int(doc, "max_batch", where, low=1),
        noise_cv=None if doc.get("noise_cv") is None else _float(doc, "noise_cv", where, low=0.0),
        drift=drift,
        changes=tuple(changes),
        switch_s=_float(doc, "switch_s", where, default=0.0, low=0.0),
        warm_switch_s=_float(doc, "warm_switch_s", where, default=0.0, low=0.0),
        input_per_sample_s=_float(doc, "input_per_sample_s", where, default=0.0, low=0.0),
        input_jitter_cv=_float(doc, "input_jitter_cv", where, default=0.0, low=0.0),
    )
    if count == 1:
        return [base]
    return [replace(base, name=f"{name}-{i}") for i in range(count)]


def _curve(raw: Any, where: str) -> list[CurvePoint]:
    if not isinstance(raw, list) or len(raw) < 2:
        raise ConfigError(f"{where}: must be a list of at least two {{batch, step_s, cv}} points")
    points = []
    for k, item in enumerate(raw):
        pw = f"{where}[{k}]"
        p = _mapping(item, pw)
        _only(p, pw, ("batch", "step_s", "cv"))
        points.append(
            CurvePoint(
                _int(p, "batch", pw, required=True, low=1),
                _float(p, "step_s", pw, required=True, low=1e-12),
                _float(p, "cv", pw, default=0.0, low=0.0),
            )
        )
    points.sort(key=lambda p: p.batch)
    if len({p.batch for p in points}) != len(points):
        raise ConfigError(f"{where}: two points at the same batch")
    return points


def _mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    return raw


def _only(doc: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> None:
    for key in doc:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")


def _int(
    doc: Mapping[str, Any],
    key: str,
    where: str,
    *,
    default: int | None = None,
    required: bool = False,
    low: int | None = None,
) -> int:
    if key not in doc:
        if required or default is None:
            raise ConfigError(f"{where}: missing required key {key!r}")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{where}.{key}: must be >= {low}, got {value}")
    return value


def _float(
    doc: Mapping[str, Any],
    key: str,
    where: str,
    *,
    default: float | None = None,
    required: bool = False,
    low: float | None = None,
) -> float:
    if key not in doc:
        if required or default is None:
            raise ConfigError(f"{where}: missing required key {key!r}")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{where}.{key}: must be >= {low}, got {value}")
    return float(value)
