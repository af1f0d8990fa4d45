"""Scenario files shipped inside the package (``bench/scenarios/`` and ``scenarios/sim/``).

``hetero-bench run`` and ``hetero-bench sim`` each keep their scenarios as YAML
files in one folder of the ``hetero.bench`` package; both list and read them
the same way, with one error naming the known ones.
"""

from __future__ import annotations

import difflib
from importlib import resources

from hetero.core.errors import ConfigError


def shipped_names(folder: str) -> list[str]:
    """Names of the ``*.yaml`` files in ``folder`` (without ``.yaml``), sorted."""
    root = resources.files("hetero.bench").joinpath(folder)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def shipped_text(folder: str, name: str) -> str:
    """The text of ``folder/name.yaml``; ``ConfigError`` naming the known ones if none."""
    known = shipped_names(folder)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown scenario {name!r} (known: {', '.join(known)}){hint}")
    return resources.files("hetero.bench").joinpath(folder, f"{name}.yaml").read_text()
