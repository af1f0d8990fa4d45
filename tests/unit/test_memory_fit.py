"""The memory model: peak = fixed + per-sample activations, fitted from recorded peaks,
and the plan that equalises time under the caps it gives."""

from __future__ import annotations

import pytest

from hetero.core.balancer import Constraints, StepModel, equal_time_plan
from hetero.core.catalogue.training import TrainingOptions
from hetero.core.memfit import GIB, fit_memory, sharded_state_bytes, state_bytes_of

MIB = 2**20


def test_the_fit_separates_fixed_state_from_per_sample_activations() -> None:
    # 6 GiB of sharded state and workspaces, 40 MiB per sample, peaks at three batch sizes
    # (two intervals at 32, the higher peak kept: peaks are maxima).
    truth = lambda b: 6 * GIB + 40 * MIB * b  # noqa: E731
    points = [(16, truth(16)), (32, truth(32) - MIB), (32, truth(32)), (48, truth(48))]
    fit = fit_memory(points, floor_bytes=4 * GIB)
    assert fit is not None and fit.sizes == 3
    assert fit.fixed_bytes == pytest.approx(6 * GIB, rel=1e-6)
    assert fit.per_sample_bytes == pytest.approx(40 * MIB, rel=1e-6)
    assert fit.peak_bytes(64) == pytest.approx(truth(64), rel=1e-6)
    # 24 GiB with 10% kept free: (21.6 GiB - 6 GiB) / 40 MiB samples.
    assert fit.cap(24 * GIB, 0.1) == int((0.9 * 24 * GIB - 6 * GIB) // (40 * MIB))


def test_no_measured_peak_lies_above_the_fitted_line() -> None:
    points = [(8, 1000), (16, 1900), (24, 2700), (32, 3900)]  # noisy, the last one high
    fit = fit_memory(points, floor_bytes=0)
    assert fit is not None
    assert all(fit.peak_bytes(b) >= p - 1e-6 for b, p in points)


def test_one_batch_size_counts_everything_above_the_floor_per_sample() -> None:
    fit = fit_memory([(32, 5 * GIB)], floor_bytes=1 * GIB)
    assert fit is not None and fit.sizes == 1
    assert (fit.fixed_bytes, fit.per_sample_bytes) == (1 * GIB, 4 * GIB / 32)
    assert fit_memory([(32, GIB)], floor_bytes=2 * GIB) is None  # nothing measurable
    assert fit_memory([], floor_bytes=0) is None


def test_a_device_that_cannot_hold_its_state_gets_a_zero_cap() -> None:
    fit = fit_memory([(8, 20 * GIB), (16, 21 * GIB)], floor_bytes=0)
    assert fit is not None and not fit.fits_state(16 * GIB, 0.1)
    assert fit.cap(16 * GIB, 0.1) == 0


def test_the_plan_equalises_time_where_memory_allows_and_pins_the_rank_it_binds() -> None:
    """Rank 0 is 3x faster but its device holds only 39 samples (measured fit, 10% margin):
    it gets its cap, and the other two split the rest for equal time."""
    fit = fit_memory([(16, 6 * GIB + 16 * 400 * MIB), (32, 6 * GIB + 32 * 400 * MIB)], 4 * GIB)
    assert fit is not None
    cap0 = fit.cap(24 * GIB, 0.1)
    assert cap0 == 39  # (0.9 · 24 GiB − 6 GiB) / 400 MiB = 39.9
    constraints = Constraints(192, 3, 1, (cap0, None, None))
    models = [StepModel(0.001, 0.0), StepModel(0.003, 0.0), StepModel(0.006, 0.0)]
    plan = equal_time_plan(models, constraints)
    assert sum(plan) == 192 and plan[0] == cap0
    assert plan[1] == pytest.approx(2 * plan[2], abs=1)  # equal time among the unbound
    unbound = equal_time_plan(models, Constraints(192, 3, 1))
    assert unbound[0] > cap0  # without the cap, speed alone would overfill rank 0


def test_sharded_state_per_rank_follows_the_sharding_mode() -> None:
    p = 350_000_000  # GPT-2 medium's order of size, fp32 AdamW: 16 bytes a parameter
    assert sharded_state_bytes(p, 2, shard="none") == 16 * p
    assert sharded_state_bytes(p, 2, shard="grad_op") == 4 * p + 12 * p / 2
    assert sharded_state_bytes(p, 2, shard="full") == 8 * p
    gpt = TrainingOptions(model="gpt2-small", shard="full")
    assert state_bytes_of(gpt, 4) == pytest.approx(124_439_808 * 16 / 4)
    assert (
        state_bytes_of(TrainingOptions(model="gpt2-small", shard="full", offload="params"), 4)
        is None
    )
