"""Memory-cap arithmetic, flag parsing and the OOM-injection spec (pure parts)."""

from __future__ import annotations

import pytest

from hetero.core.errors import ConfigError, HeteroError
from hetero.trainer.memory import cap_from, combine, parse_max_batch
from hetero.trainer.oom import Injection, parse_injections
from hetero.trainer.simulate import parse_fractions

GiB = 2**30


def test_cap_is_what_fits_the_budget_after_the_margin():
    # 16 GiB device, 2 GiB model+optimizer, peak 10 GiB at batch 64 -> 128 MiB/sample.
    cap = cap_from(16 * GiB, 2 * GiB, 10 * GiB, 64, margin=0.1)
    assert cap == int((16 * GiB * 0.9 - 2 * GiB) // (8 * GiB / 64))
    # An 80 GiB device with the same model holds far more.
    assert cap_from(80 * GiB, 2 * GiB, 10 * GiB, 64, margin=0.1) > 5 * cap
    assert cap_from(16 * GiB, 2 * GiB, 2 * GiB, 64, margin=0.1) is None  # nothing measured
    assert cap_from(GiB, 2 * GiB, 3 * GiB, 8, margin=0.1) == 0  # the model alone does not fit


def test_caps_combine_elementwise_none_meaning_unbounded():
    assert combine(None, None) is None
    assert combine((4, None, 9), None, (6, 5, None)) == (4, 5, 9)


def test_max_batch_flag():
    assert parse_max_batch("32", 3) == (32, 32, 32)
    assert parse_max_batch("32,-,8", 3) == (32, None, 8)
    assert parse_max_batch(None, 3) is None
    with pytest.raises(HeteroError, match="2 caps for 3 ranks"):
        parse_max_batch("1,2", 3)
    with pytest.raises(HeteroError, match="expected N"):
        parse_max_batch("x", 3)


def test_memory_fraction_flag():
    assert parse_fractions("0.25", 3) == [0.25] * 3
    assert parse_fractions("0.2,0.8", 2) == [0.2, 0.8]
    for bad in ("0", "1.5", "a", "0.1,0.2,0.3"):
        with pytest.raises(ConfigError):
            parse_fractions(bad, 2)


def test_oom_injection_spec():
    assert parse_injections("1:5,0:7:forward") == [
        Injection(1, 5, "backward"),
        Injection(0, 7, "forward"),
    ]
    assert parse_injections("") == []
    with pytest.raises(ConfigError):
        parse_injections("1:x")
    with pytest.raises(ConfigError):
        parse_injections("1:2:sideways")
