"""The Python API's options: ``ht.train(**options)`` and ``ht.init(**options)``.

Keywords are the options' names; a value is checked as job.yaml's and the
command line's are, and an error names the keyword. ``ht.init`` takes the
options a user's own training loop has (those marked ``init``); the others
describe a built-in job, which ``ht.train`` runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero.core.catalogue.entries import did_you_mean
from hetero.core.catalogue.options import Entry, OptionError
from hetero.core.catalogue.training import BY_NAME, OPTIONS, TrainingOptions
from hetero.core.errors import ConfigError

API_NAMES: tuple[str, ...] = tuple(o.name for o in OPTIONS if Entry.API in o.where)
INIT_NAMES: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.init)


def from_keywords(values: Mapping[str, Any], caller: str = "ht.train") -> TrainingOptions:
    """``values`` (keyword → value) as a validated ``TrainingOptions``."""
    for name in values:
        _check_name(name, API_NAMES, caller)
    try:
        return TrainingOptions(**values)
    except OptionError as exc:
        raise exc.spelled(str) from None


def init_keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    """``ht.init``'s options, checked, in canonical form (only the ones given)."""
    for name in values:
        _check_name(name, INIT_NAMES, "ht.init")
    options = from_keywords(values, "ht.init")
    return {name: getattr(options, name) for name in values}


def _check_name(name: str, allowed: tuple[str, ...], caller: str) -> None:
    if name in allowed:
        return
    option = BY_NAME.get(name)
    if option is None:
        raise ConfigError(f"{caller}(): unknown option {name!r}{did_you_mean(name, allowed)}")
    if Entry.API not in option.where:
        raise ConfigError(f"{caller}(): {name} is not a Python option: {option.absent}")
    raise ConfigError(
        f"{caller}(): {name} describes a built-in job (ht.train), not a training loop"
    )
