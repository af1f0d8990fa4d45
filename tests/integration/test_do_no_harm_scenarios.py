"""Do no harm on CPU (issue 31): the CI-sized scenarios through hetero-bench, for real.

Two ranks on Gloo under torchrun, a user's loop through the public API, hetero's
``dynamic`` alone (plain DDP's runs are the GPU scenarios' business; here the
planner's behaviour is what is pinned). The input cost is EMULATED (a busy-wait
in rank 1's loader worker), the jitter injected (seeded sleeps per sample), and
two ranks share two cores: the assertions are counts and words, never speeds.

The two that assert the planner holds still on alike ranks run ``alone`` (after the
parallel tests, with the host to itself): beside another test file's ranks the two
ranks are not alike. Under three busy loops on the 2-core box rank 1 computed 18-23 ms a
step against rank 0's 14 ms for ten intervals, and the planner rightly tried a plan.
Even alone they may measure unlike (one rank's compute 25% longer in a whole run); the
jitter test then asks for the cause the measurements support, not for one wording.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from hetero.bench.harness.commands import run_specs
from hetero.bench.harness.gpu_monitor import GpuMonitor
from hetero.bench.harness.report import write_outputs
from hetero.bench.harness.runner import execute
from hetero.bench.harness.scenario import load_scenario
from hetero.bench.harness.scenariospec import Neighbour
from hetero.bench.harness.targets import Target

pytestmark = pytest.mark.slow


def _run(scenario: str, out: Path) -> dict[str, Any]:
    """``hetero-bench run SCENARIO --no-baseline``: the dynamic run's row, summary and log."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.bench.cli",
            "run",
            scenario,
            "--no-baseline",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    run = out / "runs" / "dynamic-loader"
    return {
        "row": row,
        "summary": json.loads((run / "summary.json").read_text()),
        "rank1": [json.loads(x) for x in (run / "metrics" / "rank1.jsonl").read_text().split()],
        "log": (run / "stdout.log").read_text(),
        "report": (out / "report.md").read_text(),
    }


@pytest.mark.alone
def test_alike_ranks_behind_a_jittering_pipeline_hold_the_equal_plan_and_say_why(
    tmp_path: Path,
) -> None:
    got = _run("zoo-cpu-jitter", tmp_path)
    row = got["row"]
    assert row["intervals"] == 20 and "loader jitter: lognormal" in got["log"]
    assert row["plan_changes_per_20"] <= 1, [p["batches"] for p in got["summary"]["plans"]]
    reason = row["hold_reason"]
    assert reason.startswith("hetero is not helping here: "), reason
    assert f"| {reason} |" in got["report"]
    if "alike" not in reason:
        # The ranks are alike alone (solo_compute_ms), but in the run one may compute
        # longer than the other by more than a move would need: on a quiet 2-core box
        # rank 0 took 12.6 ms a step against rank 1's 10.1 (alone 8.9 and 9.3). Behind
        # this pipeline the loaders (about 20 ms a batch) set the step either way, so
        # the true cause is then the input, and it must be what the loaders measured.
        ranks = {r["rank"]: r for r in row["gap"]["ranks"]}
        assert "input-bound" in reason, reason
        assert all(r["input_ms"] > r["compute_ms"] for r in ranks.values()), ranks


@pytest.mark.alone
def test_an_input_bound_rank_is_given_no_more_samples_and_the_verdict_names_input(
    tmp_path: Path,
) -> None:
    got = _run("zoo-cpu-input-bound", tmp_path)
    row, equal = got["row"], 16  # global batch 32 on 2 ranks
    assert row["emulated"] and "(EMULATED heterogeneity)" in got["report"]
    assert (
        "EMULATED input cost: busy-wait per sample in the loader workers, rank 1 6 ms"
        in (got["log"])
    )
    assert all(p["batches"][1] <= equal for p in got["summary"]["plans"]), got["summary"]["plans"]
    assert all(r["batch"] <= equal for r in got["rank1"])
    # What the report knows of the loaders: rank 1's workers need its EMULATED 6 ms a
    # sample (and more on a loaded host), rank 0's a fraction of a millisecond.
    ranks = {r["rank"]: r for r in row["gap"]["ranks"]}
    per_sample = {r: ranks[r]["input_ms"] / ranks[r]["batch"] for r in (0, 1)}
    assert per_sample[1] >= 4.0 and per_sample[1] >= 5 * per_sample[0], per_sample
    # Whether its verdict names the input depends on where the plan stopped: a rank whose
    # loader needs most of the step caps its share ("input-bound on rank 1: ..."); on a
    # loaded host the step grows and the cap loosens (core/verdict.py, tested on fixed
    # numbers in tests/unit/test_gap_breakdown.py).
    assert row["hold_reason"]  # the report says why it held, whatever the planner's words


def test_a_neighbour_arriving_and_leaving_during_a_user_loop_is_switched_at_its_steps(
    tmp_path: Path,
) -> None:
    scenario = replace(
        load_scenario("zoo-cpu-jitter"),
        loader_jitter=None,
        steps=60,
        ideal_steps=0,
        baseline=False,
        neighbours=(Neighbour(gpu=0, matmul_size=64, arrive_step=20, leave_step=40, device="cpu"),),
        targets=(Target("settle_intervals", max=2),),
    )
    (spec,) = run_specs(scenario, tmp_path)
    outcome = execute(spec, scenario, GpuMonitor(0), timeout_s=180)
    assert outcome.ok, (outcome.error, (spec.out_dir / "stderr.log").read_text()[-2000:])
    assert [(s["step"], s["on"]) for s in outcome.switches] == [(0, False), (20, True), (40, False)]
    manifest = {
        "scenario": asdict(scenario),
        "runs": [spec.name],
        "changes": [list(c) for c in scenario.change_steps],
        "date": "2026-01-01T00:00:00+00:00",
        "device": "CPU",
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    result = write_outputs(tmp_path, draw_plots=False)
    windows = {r["window"]: r for r in result["rows"]}
    assert set(windows) == {"p0", "p1", "p2", "whole-run"}
    assert (windows["p1"]["window_label"], windows["p2"]["window_label"]) == (
        "neighbour arrives",
        "neighbour leaves",
    )
    assert windows["p0"]["settle_intervals"] is None  # no change to settle from
    # Checked after each change; whether it settled in 2 intervals is a speed (not here).
    assert [c["window"] for c in result["targets"]] == ["p1", "p2"]
