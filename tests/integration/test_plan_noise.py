"""The planner on a noisy host: three real Gloo ranks, emulated 1x, 2x and 3x slower, on
this machine's CPUs (on a 2-core box they share two cores, so every interval's times
swing with the load). Read from the metrics ``hetero-train`` writes:

- after the first re-plan, no plan gives a slower rank more samples than a faster one
  in more than a quarter of the intervals, and the last five plans order the ranks by
  speed (the 1x rank holds the most samples, the 3x rank the fewest);
- over the second half of the run, at most three plan changes in its 13 intervals;
- a rank reports what a change of its batch size cost it (``switch_s``) in the interval
  that changed it, and only there.

A planner that chases the noise fails these: before the balancer counted the noise of
its fits, this job changed plan at nearly every boundary and, at times, gave the 3x
rank the most samples of all ([1, 1, 94] of 96).

What the statements leave room for is the planner's designed answer to a pair it cannot
order yet. The first move rests on one interval; one interval's noise, or both ranks
held at the trust region's lower bound, can tie or invert the 2x and 3x ranks, and a
pair that the newest interval inverts is repaired to equal shares (``order.py``) until
the next interval tells. An earlier version asked for strict order in 95% of the
intervals: on a loaded 2-core CI box it failed on a run that tied those ranks for two
intervals ((52, 22, 22), then (60, 24, 12) and on), and its simulated counterpart
(``cpu-noisy-3``, 200 seeds each at 10% and 15% interval noise) failed in 4.5 to 6.5%
of the seeds, where these statements failed in none
(``tests/unit/test_sim_speed_changes.py`` keeps that check).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from hetero.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

INTERVALS = 25
INTERVAL_STEPS = 8


def test_plans_follow_emulated_speeds_and_settle_on_a_noisy_host(hetero_train, tmp_path: Path):
    out = tmp_path / "run"
    proc = hetero_train(
        "--nproc",
        "3",
        "--emulate-slowdown",
        "1:2,2:3",
        "--model",
        "simple_cnn",
        "--global-batch",
        "96",
        "--num-samples",
        "4032",  # whole global batches: no short last step changing shapes
        "--steps",
        str(INTERVALS * INTERVAL_STEPS),
        "--rebalance-interval",
        str(INTERVAL_STEPS),
        "--policy",
        "dynamic",
        "--ideal-steps",
        "0",
        "--output-dir",
        str(out),
        "--quiet",
        timeout_s=600,
    )
    assert proc.returncode == 0, proc.stderr
    records = read_metrics(out / "metrics" / "rank0.jsonl")
    assert len(records) == INTERVALS and all(r["emulated"] for r in records)
    plans = [tuple(r["plan"]) for r in records]  # the plan each interval ran
    changed = [bool(r["plan_changed"]) for r in records]

    first = changed.index(True)
    after = plans[first + 1 :]
    inverted = [p[1] > p[0] or p[2] > p[1] or p[2] > p[0] for p in after]
    assert sum(inverted) <= len(after) / 4, f"plans out of speed order: {plans}"
    assert all(p[0] > p[1] > p[2] for p in plans[-5:]), f"last plans not ordered: {plans}"

    second_half = changed[len(changed) // 2 :]
    assert sum(second_half) <= 3, f"plan changes {changed}, plans {plans}"

    for rank in range(3):
        mine = read_metrics(out / "metrics" / f"rank{rank}.jsonl")
        for before, now in itertools.pairwise(mine):
            moved = now["batch"] != before["batch"]
            assert (now["switch_s"] is not None) == moved, (rank, before, now)
            assert not moved or now["switch_s"] >= 0.0
