"""The gap breakdown's arithmetic on synthetic per-interval records (hetero.core.gap/verdict).

The records are built the way the trainer writes them (``metrics/rank<R>.jsonl``) from
known per-step phase times, so each term has a value worked out by hand. The
parts plus the achieved rate account for the ideal: exactly by construction, and
the *residual* (what the six named terms leave) stays within the boundary cost
and timing noise: at most 1% of the ideal here.
"""

from __future__ import annotations

import random

import pytest

from hetero.core.gap import TERMS, Solo, intervals_from_records, solos_from_summary
from hetero.core.verdict import diagnose, lines

# Milliseconds per step, modelled on the ViT-B/16 probe on 2x H100 (docs/design.md).
SOLO = [
    Solo(176, 176 / 0.0727, 0.4e-3, 70.0e-3, 2.7e-3),
    Solo(80, 80 / 0.0734, 0.3e-3, 66.0e-3, 7.4e-3),
]
JOB = {  # rank: (data, compute, optimizer) in seconds per step
    0: (0.3e-3, 79.6e-3, 2.8e-3),
    1: (0.2e-3, 79.3e-3, 7.6e-3),
}
STEP_S = 88.2e-3  # every rank's measured step (lock step)
BOUNDARY_S = 0.3e-3  # W − T of an interval that keeps its plan
WARMUP_S = 12e-3  # extra W − T per step of the interval that starts a new plan


def _records(
    job: dict[int, tuple[float, float, float]] = JOB,
    *,
    intervals: int = 10,
    steps: int = 10,
    change_at: int = 2,
    noise: float = 0.0,
    ddp: bool = False,
    seed: int = 0,
) -> list[list[dict]]:
    """Per-rank records: plan [128, 128] until interval ``change_at``, then [176, 80]."""
    rng = random.Random(seed)
    out: list[list[dict]] = [[], []]
    for k in range(intervals):
        plan = [176, 80] if k >= change_at else [128, 128]
        jitter = 1.0 + rng.uniform(-noise, noise)
        step_s = STEP_S * jitter
        wall = steps * (step_s + BOUNDARY_S + (WARMUP_S if k == change_at else 0.0))
        for rank in (0, 1):
            d, c, o = (x * jitter for x in job[rank])
            out[rank].append(
                {
                    "step": steps * (k + 1),
                    "rank": rank,
                    "interval_wall_s": wall,
                    "samples_per_s": 256 * steps / wall,
                    "batch": plan[rank],
                    "steps_measured": steps - 1,
                    "compute_s": None if ddp else c,
                    "phases_s": {"data": d, "optimizer": o},
                    "step_s": step_s,
                    "plan": plan,
                }
            )
    return out


def _weights() -> tuple[float, float]:
    ideal = sum(s.samples_per_s for s in SOLO)
    return SOLO[0].samples_per_s / ideal, SOLO[1].samples_per_s / ideal


def test_each_term_is_its_definition_and_the_parts_account_for_the_ideal() -> None:
    bd = diagnose(intervals_from_records(_records()), SOLO)
    assert bd is not None and bd.method == "busy" and bd.intervals == 5
    w0, w1 = _weights()
    busy = [sum(JOB[0]), sum(JOB[1])]
    t = {name: bd.term(name).ms_per_step for name in (*TERMS, "residual")}
    assert t["exposed_comm"] == pytest.approx((STEP_S - busy[1]) * 1e3)
    assert t["imbalance"] == pytest.approx((busy[1] - w0 * busy[0] - w1 * busy[1]) * 1e3)
    assert t["input_wait"] == pytest.approx((w0 * JOB[0][0] + w1 * JOB[1][0]) * 1e3)
    assert t["overlap"] == pytest.approx((w0 * (79.6e-3 - 70e-3) + w1 * (79.3e-3 - 66e-3)) * 1e3)
    assert t["optimizer"] == pytest.approx((w0 * 0.1e-3 + w1 * 0.2e-3) * 1e3)
    assert t["warmup"] == 0.0  # the change is before the window
    assert bd.critical_rank == 1
    # ideal = achieved + six terms + residual, in samples/s and in % of ideal.
    ideal = bd.ideal_samples_per_s
    assert ideal == pytest.approx(sum(s.samples_per_s for s in SOLO))
    parts = sum(bd.term(n).samples_per_s or 0.0 for n in (*TERMS, "residual"))
    assert bd.achieved_samples_per_s + parts == pytest.approx(ideal)
    assert bd.pct_of_ideal + sum(bd.term(n).pct or 0.0 for n in (*TERMS, "residual")) == (
        pytest.approx(100.0)
    )
    # The residual is the boundary cost and the solo medians: tiny here.
    solo_gap = w0 * (70e-3 + 2.7e-3 - SOLO[0].step_s) + w1 * (66e-3 + 7.4e-3 - SOLO[1].step_s)
    assert t["residual"] == pytest.approx((BOUNDARY_S + solo_gap) * 1e3, abs=1e-6)
    assert abs(bd.residual.pct or 0.0) < 1.0


def test_with_noisy_intervals_the_residual_is_the_median_against_the_mean() -> None:
    """The run reports the median interval; the terms are step-weighted means. The
    residual is exactly that difference plus the boundary cost and the solo medians."""
    w0, w1 = _weights()
    solo_gap = w0 * (70e-3 + 2.7e-3 - SOLO[0].step_s) + w1 * (66e-3 + 7.4e-3 - SOLO[1].step_s)
    for seed in range(5):
        ivs = intervals_from_records(_records(noise=0.05, seed=seed))
        rates = [256 * iv.steps / iv.wall_s for iv in ivs]
        median = sorted(rates[5:])[2]
        bd = diagnose(ivs, SOLO, achieved_samples_per_s=median)
        assert bd is not None and bd.ideal_samples_per_s is not None
        mean_rate = 256 / (bd.step_ms / 1e3)
        ideal = bd.ideal_samples_per_s
        expected = mean_rate - median + ideal * (BOUNDARY_S + solo_gap) / (bd.step_ms / 1e3)
        assert bd.residual.samples_per_s == pytest.approx(expected)
        mean_bd = diagnose(ivs, SOLO)
        assert mean_bd is not None and abs(mean_bd.residual.pct or 0.0) < 1.0


def test_a_plan_change_in_the_window_is_warm_up_beyond_the_boundary_cost() -> None:
    ivs = intervals_from_records(_records(change_at=6))
    bd = diagnose(ivs, SOLO)
    assert bd is not None and bd.plan_changes == 1  # 128/128 -> 176/80 at interval 6
    # One interval of four in the window [6, 10) paid WARMUP_S per step.
    assert bd.term("warmup").ms_per_step == pytest.approx(WARMUP_S * 1e3 / 4)
    assert bd.warmup_total_s == pytest.approx(10 * WARMUP_S)
    assert "1 plan change in the run, ~120 ms each" in bd.term("warmup").detail


def test_input_bound_rank_is_the_verdict_with_its_share_of_the_step() -> None:
    job = {0: (22e-3, 60e-3, 2.8e-3), 1: (0.2e-3, 78e-3, 7.6e-3)}
    bd = diagnose(intervals_from_records(_records(job)), SOLO)
    assert bd is not None
    assert bd.verdict.startswith("input-bound on rank 0 (25% of its step waits for data): add")
    assert bd.term("input_wait").rank == 0


def test_imbalance_names_the_phase_that_makes_the_busiest_rank_long() -> None:
    # Compute balanced, the shared GPU's optimizer 3x slower: busy differs by the optimizer.
    job = {0: (0.2e-3, 70e-3, 2.7e-3), 1: (0.2e-3, 70e-3, 17e-3)}
    solos = [Solo(176, 176 / 0.0727, None, 70e-3, 2.7e-3), Solo(80, 80 / 0.087, None, 70e-3, 17e-3)]
    records = _records(job)
    for rec in records[0] + records[1]:
        rec["step_s"] = 87.5e-3
    bd = diagnose(intervals_from_records(records), solos)
    assert bd is not None and bd.critical_rank == 1
    assert bd.verdict.startswith("imbalance: rank 1 is busy")
    assert "mostly the optimizer step" in bd.verdict


def test_plain_ddp_takes_imbalance_from_the_solo_times() -> None:
    solos = [Solo(128, 128 / 0.053, None, 50e-3, 2.7e-3), Solo(128, 128 / 0.12, None, 110e-3, 9e-3)]
    job = {0: (0.3e-3, 0.0, 2.8e-3), 1: (0.4e-3, 0.0, 9.5e-3)}
    bd = diagnose(intervals_from_records(_records(job, ddp=True, change_at=0)), solos)
    assert bd is not None and bd.method == "solo" and bd.critical_rank == 1
    ideal = sum(s.samples_per_s for s in solos)
    assert bd.term("imbalance").ms_per_step == pytest.approx((0.12 - 256 / ideal) * 1e3)
    assert bd.term("input_wait").ms_per_step == pytest.approx(0.4)
    assert bd.term("optimizer").ms_per_step == pytest.approx(0.5)
    assert bd.term("overlap").ms_per_step is None
    assert bd.verdict.startswith("imbalance: equal batches leave rank 1")
    parts = sum(bd.term(n).samples_per_s or 0.0 for n in (*TERMS, "residual"))
    assert bd.achieved_samples_per_s + parts == pytest.approx(ideal)


def test_without_a_solo_measurement_shares_are_of_the_step_and_overlap_is_na() -> None:
    bd = diagnose(intervals_from_records(_records()), None)
    assert bd is not None and bd.ideal_samples_per_s is None and bd.pct_of_ideal is None
    assert bd.term("overlap").ms_per_step is None and bd.term("residual").pct is None
    assert bd.term("exposed_comm").pct == pytest.approx(
        100 * (STEP_S - sum(JOB[1])) / (STEP_S + BOUNDARY_S)
    )
    text = "\n".join(lines(bd.to_dict()))
    assert "ideal n/a" in text and "% of step" in text and "verdict: " in text


def test_summaries_of_older_runs_give_rates_only_and_compute_with_optimizer_together() -> None:
    summary = {"final_plan": [176, 80], "standalone_samples_per_s": [2420.9, 1090.0]}
    solos = solos_from_summary(summary)
    assert solos is not None and solos[0].compute_s is None
    bd = diagnose(intervals_from_records(_records()), solos)
    assert bd is not None and bd.term("optimizer").ms_per_step is None
    assert bd.term("overlap").ms_per_step is not None
    assert solos_from_summary({"final_plan": [1], "standalone_samples_per_s": [0.0]}) is None


def test_the_stored_form_renders_every_term_and_rank() -> None:
    bd = diagnose(intervals_from_records(_records()), SOLO)
    assert bd is not None
    text = lines(bd.to_dict())
    assert text[0].startswith("gap to ideal, steps 50-100 (5 intervals): ")
    for label in ("imbalance", "input wait", "exposed communication", "lost to overlap",
                  "optimizer", "plan-change warm-up", "residual"):  # fmt: skip
        assert any(line.strip().startswith(label) for line in text), label
    assert sum(line.strip().split()[0] in ("0", "1") for line in text) == 2
    assert text[-1] == f"verdict: {bd.verdict}"
