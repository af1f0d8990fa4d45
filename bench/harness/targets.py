"""A scenario's targets, and each one checked against a run's rows (pure, no torch).

A scenario may state what its runs must show (``targets:`` in its YAML), each a
figure of ``results.py``'s rows with a bound, optionally for some runs only::

    targets:
      - {metric: vs_ddp, min: 1.0}                    # every hetero run
      - {metric: vs_ddp, min: 1.3, num_workers: 12}   # the 12-worker runs
      - {metric: plan_changes_per_20, max: 1}

``hetero-bench report`` checks every target on every run (and window) it
applies to and prints each with its measured value and pass or miss
(``results.json``: ``targets``). A value the run did not measure is ``n/a``,
which is not a pass. The figures (``METRICS``) are ratios within one run.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero.core.errors import ConfigError


@dataclass(frozen=True)
class Metric:
    """A figure a target can bound: its row column, which bound it takes, which rows carry
    it (``windows``: ``phases`` = every phase row, ``steady`` = a run without changes,
    ``changes`` = the phases after a change, ``run`` = once per run), and its words."""

    column: str
    bound: str  # "min" or "max"
    windows: str
    text: str
    fmt: str = "{:.2f}"


METRICS: Mapping[str, Metric] = {
    "vs_ddp": Metric(
        "speedup_vs_ddp", "min", "phases", "samples/s over plain DDP's (same pair)", "{:.2f}x"
    ),
    "whole_vs_steady": Metric(
        "whole_vs_steady", "min", "steady", "whole-run over steady samples/s", "{:.3f}"
    ),
    "plan_changes_per_20": Metric(
        "plan_changes_per_20", "max", "run", "plan changes per 20 intervals"
    ),
    "change_cost_steps": Metric(
        "change_cost_steps", "max", "run", "costliest plan change, in steps"
    ),
    "settle_intervals": Metric(
        "settle_intervals",
        "max",
        "changes",
        "intervals after a change until within 5% of the new steady samples/s",
        "{:.0f}",
    ),
}


@dataclass(frozen=True)
class Target:
    """``metric`` bounded by ``min`` or ``max`` on the runs that match the filters
    (``policy``: default every hetero policy; ``data_path``; ``num_workers``)."""

    metric: str
    min: float | None = None
    max: float | None = None
    policy: str | None = None
    data_path: str | None = None
    num_workers: int | None = None

    @property
    def spec(self) -> Metric:
        return METRICS[self.metric]

    @property
    def limit(self) -> float:
        value = self.min if self.spec.bound == "min" else self.max
        assert value is not None  # parse_targets checks it
        return value

    def label(self) -> str:
        sign = ">=" if self.spec.bound == "min" else "<="
        scope = ", ".join(
            f"{k} {v}"
            for k, v in (
                ("policy", self.policy),
                ("path", self.data_path),
                ("workers", self.num_workers),
            )
            if v is not None
        )
        return f"{self.metric} {sign} {self.limit:g}" + (f" ({scope})" if scope else "")

    def matches(self, row: Mapping[str, Any]) -> bool:
        if self.policy is None and row.get("policy") in ("ddp", "gpu-only"):
            return False
        return all(
            want is None or row.get(key) == want
            for key, want in (
                ("policy", self.policy),
                ("data_path", self.data_path),
                ("num_workers", self.num_workers),
            )
        )

    def passes(self, value: float) -> bool:
        return value >= self.limit if self.spec.bound == "min" else value <= self.limit


def parse_targets(data: Any, where: str) -> tuple[Target, ...]:
    """The ``targets:`` list of a scenario; errors name ``where`` and the entry."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError(f"{where}: expected a list of targets")
    fields = {f.name for f in dataclasses.fields(Target)}
    out = []
    for i, entry in enumerate(data):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}: expected a mapping such as {{metric: vs_ddp, min: 1.0}}")
        for key in entry:
            if key not in fields:
                close = difflib.get_close_matches(str(key), sorted(fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{at}: unknown key {key!r}{hint}")
        raw = entry.get("metric")
        if raw not in METRICS:
            raise ConfigError(f"{at}.metric: expected one of {', '.join(METRICS)}, got {raw!r}")
        metric = str(raw)
        bound = METRICS[metric].bound
        if entry.get(bound) is None or entry.get("max" if bound == "min" else "min") is not None:
            raise ConfigError(f"{at}: {metric} takes a {bound}, and only that bound")
        try:
            out.append(Target(**entry))
        except TypeError as exc:
            raise ConfigError(f"{at}: {exc}") from None
    return tuple(out)


def _rows_for(metric: Metric, rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if metric.windows == "phases":
        return [r for r in rows if r["window"] != "whole-run"]
    if metric.windows == "steady":
        return [r for r in rows if r["window"] == "steady"]
    if metric.windows == "changes":
        return [r for r in rows if r["window"] not in ("steady", "whole-run", "p0")]
    seen: set[str] = set()
    out = []
    for r in rows:
        if r["run"] not in seen:
            seen.add(r["run"])
            out.append(r)
    return out


def check(targets: Sequence[Target], rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every target on every row it applies to: ``{target, metric, run, window, value,
    limit, result}`` with ``result`` one of ``pass``, ``miss`` and ``n/a``."""
    out = []
    for t in targets:
        for r in _rows_for(t.spec, [r for r in rows if t.matches(r)]):
            value = r.get(t.spec.column)
            result = "n/a" if value is None else ("pass" if t.passes(float(value)) else "miss")
            out.append(
                {
                    "target": t.label(),
                    "metric": t.metric,
                    "run": r["run"],
                    "window": r["window"],
                    "value": value,
                    "limit": t.limit,
                    "result": result,
                    "measured": "n/a" if value is None else t.spec.fmt.format(value),
                }
            )
    return out


def section(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's lines for the checked targets (none without targets)."""
    if not checks:
        return []
    passed = sum(c["result"] == "pass" for c in checks)
    out = [
        "",
        f"## Targets ({passed} of {len(checks)} met)",
        "",
        "| target | run | window | measured | result |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for c in checks:
        out.append(
            f"| {c['target']} | {c['run']} | {c['window']} | {c['measured']} | "
            f"{c['result'].upper() if c['result'] == 'miss' else c['result']} |"
        )
    out += ["", *(f"- `{name}`: {m.text}" for name, m in METRICS.items())]
    return out
