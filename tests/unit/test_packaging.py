"""The installed `hetero` namespace lists every package folder (a missing one would
ship a wheel that imports fine in editable mode and breaks when installed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_for_setuptools():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for name, folder in cfg["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    # A subfolder mapped on its own (hetero.v1 under proto/) is found under both names.
    assert found - listed <= {p for p in found if p.startswith("hetero.hetero")}
    assert listed <= found, f"listed but missing on disk: {sorted(listed - found)}"
    missing = sorted(p for p in found - listed if not p.startswith("hetero.hetero"))
    assert not missing, f"package folders not in [tool.setuptools] packages: {missing}"


def test_console_scripts_point_at_real_functions():
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name
