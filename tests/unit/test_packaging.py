"""The installed ``hetero`` package is the checkout's ``hetero/``: the package root, the
entry points and one relative link to each package folder (a folder without its link
would be missing from the wheel while every test still passed against the checkout)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Top-level folders that hold Python files but are no part of the package.
NOT_PACKAGES = {"hetero", "tests", "examples", "docs", "deploy", "docker", "build"}


def test_every_package_folder_is_linked_under_hetero():
    folders = {
        d.name
        for d in ROOT.iterdir()
        if d.is_dir() and not d.is_symlink() and (d / "__init__.py").is_file()
    } - NOT_PACKAGES
    linked = {
        link.name: link.resolve() for link in (ROOT / "hetero").iterdir() if link.is_symlink()
    }
    assert linked.get("v1") == (ROOT / "proto" / "hetero" / "v1").resolve()
    missing = sorted(f for f in folders if linked.get(f) != (ROOT / f).resolve())
    assert not missing, f"package folders without a link hetero/NAME -> ../NAME: {missing}"
    for name, target in linked.items():
        assert (target / "__init__.py").is_file(), f"hetero/{name} links to {target}"
        link = (ROOT / "hetero" / name).readlink()
        assert not link.is_absolute(), f"hetero/{name} -> {link}: a link must be relative"


def test_setuptools_finds_every_package_through_the_links():
    """What the wheel will hold: setuptools' discovery follows the links to every package."""
    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = find["packages"]["find"]["include"]
    assert set(find_packages(str(ROOT), include=include)) == _walk(ROOT / "hetero")


def _walk(package: Path) -> set[str]:
    """Dotted names of ``package`` and every package below it, following links."""
    found = set()
    for folder, dirs, files in os.walk(package, followlinks=True):
        if "__init__.py" in files:
            found.add(".".join(Path(folder).relative_to(package.parent).parts))
        dirs[:] = [d for d in dirs if d != "__pycache__"]
    return found


def test_console_scripts_point_at_real_functions():
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name
