"""The memory columns of hetero-bench's rows: measured peaks beside the start-up
probe's prediction, also for a mixed job whose CPU ranks the probe skips."""

from __future__ import annotations

from typing import Any

import pytest

from hetero.bench.harness.results import memory_columns

GB = 1e9


def _probe(fixed_gb: float, per_sample_gb: float) -> dict[str, float]:
    return {
        "fixed_bytes": fixed_gb * GB,
        "per_sample_bytes": per_sample_gb * GB,
        "optimizer_bytes": 0.0,
    }


def _recs(*pairs: tuple[int, float]) -> list[dict[str, Any]]:
    return [{"batch": b, "peak_memory_bytes": gb * GB} for b, gb in pairs]


def test_every_rank_probed_gives_peaks_predictions_and_the_largest_error() -> None:
    cols = memory_columns(
        {"memory_probe": [_probe(1.0, 0.1), _probe(2.0, 0.2)]},
        [_recs((10, 2.0), (20, 3.3)), _recs((5, 3.0))],
    )
    assert cols["peak_memory_gb"] == [3.3, 3.0]
    assert cols["predicted_peak_memory_gb"] == [3.0, 3.0]
    assert cols["memory_prediction_error"] == pytest.approx(1 - 3.0 / 3.3)


def test_a_rank_the_probe_skipped_has_its_peak_and_no_prediction() -> None:
    """A GPU rank beside CPU ranks: the probe ran on the GPU only (its list holds None
    for the others), which used to stop the report with a TypeError."""
    cols = memory_columns(
        {"memory_probe": [_probe(1.0, 0.1), None, None]},
        [_recs((100, 11.0)), _recs((4, 0.5)), []],
    )
    assert cols["peak_memory_gb"] == [11.0, 0.5, None]
    assert cols["predicted_peak_memory_gb"] == [11.0, None, None]
    assert cols["memory_prediction_error"] == pytest.approx(0.0)
