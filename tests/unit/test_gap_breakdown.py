"""The gap breakdown's arithmetic on synthetic per-interval records (hetero.core.gap/verdict).

The records are built the way the trainer writes them (``metrics/rank<R>.jsonl``) from
known per-step phase means, so each term has a value worked out by hand; the terms
are each ≥ 0 and sum to the gap, step time − ideal step. ``test_gap_properties.py``
checks the same over generated intervals and every recorded run.
"""

from __future__ import annotations

from typing import Any

import pytest

from hetero.core.gap import LABELS, TERMS, Solo, intervals_from_records, solos_from_summary
from hetero.core.verdict import diagnose, lines

# Seconds per step, modelled on the ViT-B/16 probe on 2x H100 (docs/design.md). Solo
# compute + optimizer is the solo step, so the job's phases compare one to one.
SOLO = [
    Solo(176, 176 / 0.0727, 0.4e-3, 70.0e-3, 2.7e-3),
    Solo(80, 80 / 0.0734, 0.3e-3, 66.0e-3, 7.4e-3),
]
JOB = {  # rank: (data, compute, optimizer), seconds per step
    0: (0.3e-3, 79.6e-3, 2.8e-3),
    1: (0.2e-3, 79.3e-3, 7.6e-3),
}
STEP_S = 88.2e-3  # every rank's mean step (lock step): comm is what busy leaves of it
BOUNDARY_S = 0.3e-3  # time outside the steps, per step, of an interval that keeps its plan
WARMUP_S = 12e-3  # extra per step of the interval that starts a new plan


def _records(
    job: dict[int, tuple[float, float, float]] = JOB,
    *,
    intervals: int = 10,
    steps: int = 10,
    change_at: int = 2,
    step_s: float = STEP_S,
    ddp: bool = False,
    extra: dict[int, float] | None = None,
    median_step_s: float | None = None,
    final: tuple[int, int] = (176, 80),
) -> list[list[dict[str, Any]]]:
    """Per-rank records: plan [128, 128] until interval ``change_at``, then ``final``.
    ``extra``: seconds per step more wall time in the intervals named."""
    out: list[list[dict[str, Any]]] = [[], []]
    for k in range(intervals):
        plan = list(final) if k >= change_at else [128, 128]
        more = (WARMUP_S if k == change_at else 0.0) + (extra or {}).get(k, 0.0)
        wall = steps * (step_s + BOUNDARY_S + more)
        for rank in (0, 1):
            d, c, o = job[rank]
            phases = {"data": d, "forward": c / 3, "backward": 2 * c / 3, "optimizer": o}
            if ddp:
                phases = {"data": d, "backward": step_s - d - o, "optimizer": o}
            else:
                phases["comm"] = step_s - d - c - o
            out[rank].append(
                {
                    "step": steps * (k + 1),
                    "rank": rank,
                    "interval_wall_s": wall,
                    "batch": plan[rank],
                    "steps_measured": steps - 1,
                    "compute_s": None if ddp else c,
                    "phases_s": phases,
                    "step_s": median_step_s or step_s,  # a median: not what the terms use
                    "plan": plan,
                }
            )
    return out


def _weights() -> tuple[float, float]:
    ideal = sum(s.samples_per_s for s in SOLO)
    return SOLO[0].samples_per_s / ideal, SOLO[1].samples_per_s / ideal


def _ms(bd: Any) -> dict[str, float]:
    return {t: bd.term(t).ms_per_step for t in TERMS}


def _sums_to_gap(bd: Any) -> None:
    terms = [bd.term(t).ms_per_step or 0.0 for t in TERMS]
    assert all(x >= 0 for x in terms)
    assert sum(terms) == pytest.approx(max(bd.gap_ms, 0.0), abs=1e-9)
    assert bd.adds_up and bd.gap_ms == pytest.approx(bd.step_ms - bd.reference_ms)


def test_each_term_is_its_definition_and_the_terms_sum_to_the_gap() -> None:
    bd = diagnose(intervals_from_records(_records()), SOLO)
    assert bd is not None and bd.method == "busy" and bd.intervals == 5
    w0, w1 = _weights()
    busy = [sum(JOB[0]), sum(JOB[1])]
    t = _ms(bd)
    assert bd.step_ms == pytest.approx((STEP_S + BOUNDARY_S) * 1e3)
    assert bd.reference_ms == pytest.approx(256 / sum(s.samples_per_s for s in SOLO) * 1e3)
    assert t["exposed_comm"] == pytest.approx((STEP_S - busy[1]) * 1e3)
    assert t["imbalance"] == pytest.approx((busy[1] - w0 * busy[0] - w1 * busy[1]) * 1e3)
    assert t["input_wait"] == pytest.approx((w0 * JOB[0][0] + w1 * JOB[1][0]) * 1e3)
    assert t["overlap"] == pytest.approx((w0 * (79.6e-3 - 70e-3) + w1 * (79.3e-3 - 66e-3)) * 1e3)
    assert t["optimizer"] == pytest.approx((w0 * 0.1e-3 + w1 * 0.2e-3) * 1e3)
    assert t["boundary"] == pytest.approx(BOUNDARY_S * 1e3)
    assert t["plan_changes"] == t["pauses"] == 0.0  # the change is before the window
    assert bd.term("imbalance").rank == 1 and bd.critical_rank == 1
    assert bd.scale == 1.0  # nothing faster in the job than alone: nothing absorbed
    _sums_to_gap(bd)
    ideal = bd.ideal_samples_per_s
    parts = sum(bd.term(n).samples_per_s or 0.0 for n in TERMS)
    assert bd.achieved_samples_per_s + parts == pytest.approx(ideal)
    assert bd.pct_of_ideal + sum(bd.term(n).pct or 0.0 for n in TERMS) == pytest.approx(100.0)


def test_a_bursty_loader_is_timed_by_its_mean_step_not_the_median() -> None:
    """The issue's DataLoader run: batches arrive in bursts, so the median step (what
    ``step_s`` records) is far below the mean the wall time shows. The breakdown reads
    the phase means, and nothing comes out negative."""
    job = {0: (45e-3, 70e-3, 2.8e-3), 1: (44e-3, 66e-3, 7.6e-3)}
    records = _records(job, step_s=125e-3, median_step_s=79e-3)
    bd = diagnose(intervals_from_records(records), SOLO)
    assert bd is not None
    _sums_to_gap(bd)
    assert bd.step_ms == pytest.approx((125e-3 + BOUNDARY_S) * 1e3)
    assert bd.term("exposed_comm").ms_per_step == pytest.approx((125e-3 - sum(job[0])) * 1e3)
    assert bd.largest == "input_wait"
    assert bd.verdict.startswith("input wait: ")
    assert "most on rank 0 (36% of its step waits for data)" in bd.verdict


def test_a_plan_change_in_the_window_costs_its_time_beyond_the_steady_pace() -> None:
    bd = diagnose(intervals_from_records(_records(change_at=6)), SOLO)
    assert bd is not None and bd.plan_changes == 1  # 128/128 -> 176/80 at interval 6
    # One interval of four in the window [6, 10) paid WARMUP_S per step.
    assert bd.term("plan_changes").ms_per_step == pytest.approx(WARMUP_S * 1e3 / 4)
    assert "1 new plan, ~0.12 s each" in bd.term("plan_changes").detail
    _sums_to_gap(bd)
    w = bd.whole_run  # the run after its first interval
    assert w is not None and w.plan_changes == 1
    assert w.plan_change_s == pytest.approx(10 * WARMUP_S)


def test_a_run_whose_plan_changes_restart_the_loader_says_what_they_cost_the_run() -> None:
    """Seconds per change (the loader's workers restarting) on short intervals: the
    steady figure hides them, the whole-run line and the verdict name them."""
    stalls = {2: 0.4, 5: 0.4, 8: 0.4}  # +0.4 s per step for 10 steps: 4 s each
    records = _records(change_at=2, extra=stalls)
    for rank, b in ((0, 180), (1, 76)):  # two more moves: to 180/76 at 5, back at 8
        for j in (5, 6, 7):
            records[rank][j]["batch"] = b
    bd = diagnose(intervals_from_records(records), SOLO)
    assert bd is not None
    assert bd.largest == "plan_changes" and bd.verdict.startswith("plan changes: ")
    _sums_to_gap(bd)
    w = bd.whole_run
    assert w is not None and w.plan_changes == 3
    assert w.plan_change_s == pytest.approx(3 * 4.0 + 10 * WARMUP_S)
    assert w.samples_per_s < 0.5 * w.steady_samples_per_s and w.plan_change_pct > 55
    text = "\n".join(lines(bd.to_dict()))
    assert (
        f"plan changes cost {w.plan_change_pct:.0f}% of the run: 3 intervals with a new plan "
        "took 12.1 s beyond the steady pace (~4.04 s each)"
    ) in text


def test_a_stall_on_one_rank_is_its_input_wait_not_the_others_communication() -> None:
    """At an epoch's start one rank's loader stalls; its peer waits in the all-reduce.
    The critical rank is chosen per interval, so the stall is input wait."""
    records = _records(change_at=0)
    stall = 60e-3
    for k in (6, 8):  # rank 0 waits 60 ms more per step for data; rank 1 waits for rank 0
        for rank in (0, 1):
            r = records[rank][k]
            d, c, o = JOB[rank]
            r["phases_s"]["data"] = d + (stall if rank == 0 else 0.0)
            r["phases_s"]["comm"] = STEP_S + stall - r["phases_s"]["data"] - c - o
            r["interval_wall_s"] = 10 * (STEP_S + stall + BOUNDARY_S)
    bd = diagnose(intervals_from_records(records), SOLO)
    assert bd is not None and bd.largest == "input_wait"
    assert bd.term("input_wait").rank == 0
    _sums_to_gap(bd)


def test_the_busiest_phase_names_the_imbalance() -> None:
    # Compute balanced, the shared GPU's optimizer 3x slower: busy differs by the optimizer.
    job = {0: (0.2e-3, 70e-3, 2.7e-3), 1: (0.2e-3, 70e-3, 17e-3)}
    solos = [Solo(176, 176 / 0.0727, None, 70e-3, 2.7e-3), Solo(80, 80 / 0.087, None, 70e-3, 17e-3)]
    bd = diagnose(intervals_from_records(_records(job, step_s=87.5e-3)), solos)
    assert bd is not None and bd.critical_rank == 1
    assert bd.verdict.startswith("imbalance: ")
    assert "rank 1 is the busiest, mostly the optimizer step" in bd.verdict
    _sums_to_gap(bd)


def test_plain_ddp_takes_imbalance_from_the_solo_times() -> None:
    solos = [Solo(128, 128 / 0.053, None, 50e-3, 3e-3), Solo(128, 128 / 0.12, None, 111e-3, 9e-3)]
    job = {0: (0.3e-3, 0.0, 2.8e-3), 1: (0.4e-3, 0.0, 9.5e-3)}
    records = _records(job, ddp=True, change_at=0, step_s=0.13, final=(128, 128))
    bd = diagnose(intervals_from_records(records), solos)
    assert bd is not None and bd.method == "solo" and bd.critical_rank == 1
    ideal = sum(s.samples_per_s for s in solos)
    t = _ms(bd)
    assert t["imbalance"] == pytest.approx((0.12 - 256 / ideal) * 1e3)
    assert t["input_wait"] == pytest.approx(0.4)
    assert t["optimizer"] == pytest.approx(0.5)
    assert t["exposed_comm"] == pytest.approx((0.13 - 0.4e-3 - 9.5e-3 - 111e-3) * 1e3)
    assert t["overlap"] is None
    assert bd.verdict.startswith("imbalance: ") and "equal batches leave rank 1" in bd.verdict
    _sums_to_gap(bd)


def test_without_a_solo_measurement_the_gap_is_to_the_ranks_own_work() -> None:
    bd = diagnose(intervals_from_records(_records()), None)
    assert bd is not None and bd.ideal_samples_per_s is None and bd.pct_of_ideal is None
    assert bd.term("overlap").ms_per_step is None and bd.term("optimizer").ms_per_step is None
    assert bd.term("exposed_comm").pct == pytest.approx(
        100 * (STEP_S - sum(JOB[1])) / (STEP_S + BOUNDARY_S)
    )
    _sums_to_gap(bd)
    text = "\n".join(lines(bd.to_dict()))
    assert "ideal n/a" in text and "% of step" in text and "verdict: " in text


def test_older_summaries_give_rates_only_and_compute_with_optimizer_together() -> None:
    summary = {"final_plan": [176, 80], "standalone_samples_per_s": [2420.9, 1090.0]}
    solos = solos_from_summary(summary)
    assert solos is not None and solos[0].compute_s is None
    bd = diagnose(intervals_from_records(_records()), solos)
    assert bd is not None and bd.term("optimizer").ms_per_step is None
    assert bd.term("overlap").ms_per_step is not None
    _sums_to_gap(bd)
    assert solos_from_summary({"final_plan": [1], "standalone_samples_per_s": [0.0]}) is None


def test_a_job_faster_than_alone_scales_the_other_terms_to_the_gap_and_says_so() -> None:
    """The solo run times its optimizer around a device sync: a few ms more than the job
    spends. That credit comes off the other terms in proportion, in a note."""
    slow_alone = [
        Solo(s.batch, s.batch / (c + o + 2e-3), None, c, o + 2e-3)
        for s, (_, c, o) in zip(SOLO, (JOB[0], JOB[1]), strict=True)
    ]
    bd = diagnose(intervals_from_records(_records()), slow_alone)
    assert bd is not None and bd.scale < 1.0
    assert bd.term("optimizer").ms_per_step == 0.0
    _sums_to_gap(bd)
    assert any("the job beat its reference somewhere" in n for n in bd.notes)


def test_a_job_at_or_above_its_ideal_has_nothing_to_break_down() -> None:
    fast = [Solo(s.batch, s.batch / 0.095, None, 0.09, 0.005) for s in SOLO]
    bd = diagnose(intervals_from_records(_records()), fast)
    assert bd is not None and bd.gap_ms < 0 and bd.largest is None
    assert all(bd.term(t).ms_per_step in (0.0, None) for t in TERMS)
    assert "nothing to break down" in bd.verdict


def test_the_stored_form_renders_every_term_the_gap_and_every_rank() -> None:
    bd = diagnose(intervals_from_records(_records()), SOLO)
    assert bd is not None
    text = lines(bd.to_dict())
    assert text[0].startswith("gap to ideal, steps 50-100 (5 intervals): ")
    for name in TERMS:
        assert any(line.strip().startswith(LABELS[name]) for line in text), name
    assert any(line.strip().startswith("= the gap") for line in text)
    assert sum(line.strip().split()[0] in ("0", "1") for line in text) == 2
    assert any(line.startswith("whole run, steps 10-100: ") for line in text)
    assert text[-1] == f"verdict: {bd.verdict}"


def test_a_breakdown_stored_before_the_terms_added_up_is_not_shown() -> None:
    old = {"terms": {"exposed_comm": {"ms_per_step": -53.9}}, "residual": {}, "verdict": "x"}
    assert lines(old) == [
        "gap to ideal: stored by an older hetero; `hetero-bench report` recomputes it"
    ]


@pytest.mark.parametrize(
    ("input_s", "says"),
    [
        (0.20, "its workers fall behind: 200.0 ms a batch, 80.3 ms a step without the wait: add"),
        (
            0.05,
            "its workers keep up: 50.0 ms a batch, 80.3 ms a step without the wait: the waits "
            "are stalls, not the loader's pace",
        ),
    ],
)
def test_where_records_carry_the_loaders_pace_the_verdict_tells_pace_from_stalls(
    input_s: float, says: str
) -> None:
    job = {0: (45e-3, 70e-3, 2.8e-3), 1: (44e-3, 66e-3, 7.6e-3)}
    records = _records(job, step_s=125e-3)
    for rec in records[0] + records[1]:
        rec["input_s"] = input_s
    bd = diagnose(intervals_from_records(records), SOLO)
    assert bd is not None and bd.ranks[0].input_ms == pytest.approx(input_s * 1e3)
    assert bd.verdict.startswith("input wait: ") and says in bd.verdict
    # Records without the field (every run so far) say nothing of the loader's pace.
    without = diagnose(intervals_from_records(_records(job, step_s=125e-3)), SOLO)
    assert without is not None and "a batch" not in without.verdict


def test_an_imbalance_beside_a_rank_whose_loader_caps_its_share_is_called_input_bound() -> None:
    # Rank 0 carries more than its speed says because rank 1's loader cannot make more:
    # its workers need 60 ms for its batch of a 87.5 ms step.
    job = {0: (0.2e-3, 80e-3, 2.7e-3), 1: (0.2e-3, 40e-3, 2.7e-3)}
    records = _records(job, step_s=87.5e-3)
    for rec in records[1]:
        rec["input_s"] = 60e-3
    bd = diagnose(intervals_from_records(records), SOLO)
    assert bd is not None and bd.largest == "imbalance" and bd.critical_rank == 0
    assert bd.verdict.startswith("input-bound on rank 1: its loader makes a batch of 80 in 60.0 ms")
    assert "imbalance: " in bd.verdict and "add loader workers on rank 1" in bd.verdict
    # A loader with time to spare leaves it the plan's imbalance.
    for rec in records[1]:
        rec["input_s"] = 10e-3
    spare = diagnose(intervals_from_records(records), SOLO)
    assert spare is not None and spare.verdict.startswith("imbalance: ")
