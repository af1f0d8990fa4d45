"""Activation checkpointing for a user's own model on real Gloo ranks: a custom loop's
model without a switch gets its repeated blocks recomputed on the one rank whose
(emulated) memory binds under ``auto``, and trains as it does without.

CPU ranks cannot measure a peak, so ``HETERO_PROBE_MEMORY`` has rank 1 report a known
line instead, as ``test_memory_probe`` does for the built-in models: 1 GB + 0.5 GB a
sample under a 4 GB limit (5 samples), 0.1 GB a sample recomputing (25).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SHARDS = ("none", "full")
BINDS = "1:4e9:1e9:5e8:1e8"


@pytest.fixture(scope="module")
def runs(ranks_in_turn, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per shard mode: ``auto`` with rank 1's memory binding, and ``off`` with nothing
    binding (both run the equal split, so BatchNorm sees the same batches); 2 ranks,
    one launch."""
    out = tmp_path_factory.mktemp("user-recompute")
    jobs = []
    for shard in SHARDS:
        jobs.append(["user_recompute.py", str(out / f"auto-{shard}.json"), "auto", shard, BINDS])
        jobs.append(["user_recompute.py", str(out / f"off-{shard}.json"), "off", shard, "-"])
    ranks_in_turn(out, 2, jobs)
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shard", SHARDS)
def test_a_user_models_blocks_recompute_on_the_rank_whose_memory_binds(
    runs: Path, shard: str
) -> None:
    """Under auto rank 1 recomputes the model's three blocks, alone, and runs the equal
    split of 48. Against the run where nothing binds and nothing is recomputed: every
    step's loss, the weights and BatchNorm's running statistics agree to rounding (DDP,
    or FSDP2 with the blocks inside one unit)."""
    got = json.loads((runs / f"auto-{shard}.json").read_text())
    ref = json.loads((runs / f"off-{shard}.json").read_text())
    recompute = got["recompute"]
    assert recompute["ranks"] == [False, True]
    assert recompute["reasons"][1].startswith("on: memory holds 5 of the 24 samples")
    assert recompute["blocks"] == "3 Block: blocks.0 … blocks.2"
    assert ref["recompute"]["ranks"] == [False, False] and "blocks" not in ref["recompute"]
    assert got["plan"] == ref["plan"] == [24, 24]
    assert len(got["losses"]) == 6
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert got["state"].keys() == ref["state"].keys()
    assert any(k.endswith("running_mean") for k in got["state"])
    for key, value in ref["state"].items():
        assert got["state"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
