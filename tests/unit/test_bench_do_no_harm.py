"""The do-no-harm scenarios without running them: worker-count variants, alternating pairs,
pipeline delays on the command line, and the report's targets computed from a run's files."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from hetero.bench.harness import figures
from hetero.bench.harness.commands import run_specs
from hetero.bench.harness.report import write_outputs
from hetero.bench.harness.resize import configure
from hetero.bench.harness.scenario import load_scenario, parse_scenario
from hetero.bench.harness.targets import Target, check, parse_targets
from hetero.core.errors import ConfigError

BASE = "devices: cuda\nranks: 2\ngpus: 2\nmodel: resnet50\nglobal_batch: 8\nsteps: 20\nloop: zoo\n"


def _arg(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_worker_counts_are_variants_each_compared_with_its_own_plain_ddp(tmp_path: Path) -> None:
    jpeg = load_scenario("zoo-jpeg-resnet50")
    assert jpeg.run_names() == (
        "ddp-jpeg-w8",
        "dynamic-jpeg-w8",
        "ddp-jpeg-w12",
        "dynamic-jpeg-w12",
    )
    specs = {s.name: s for s in run_specs(jpeg, tmp_path, python="py")}
    for name, spec in specs.items():
        assert _arg(spec.argv, "--data") == "jpeg"
        assert _arg(spec.argv, "--num-workers") == name.rsplit("-w", 1)[1] == str(spec.num_workers)
    assert configure(jpeg, quick=True).run_names() == ("ddp-jpeg", "dynamic-jpeg")
    assert jpeg.neighbour is not None and jpeg.neighbour.arrive_step is None
    assert [t.label() for t in jpeg.targets][:2] == ["vs_ddp >= 1", "vs_ddp >= 1.3 (workers 12)"]


def test_repeats_run_plain_ddp_and_hetero_in_alternating_pairs_with_the_jitter(
    tmp_path: Path,
) -> None:
    jitter = load_scenario("zoo-alike-jitter")
    assert jitter.neighbours == () and jitter.model != "resnet50" and jitter.steps >= 300
    assert jitter.run_names() == tuple(
        f"{p}-loader-r{k}" for k in (1, 2, 3) for p in ("ddp", "dynamic")
    )
    specs = run_specs(jitter, tmp_path, python="py")
    assert [s.repeat for s in specs] == [1, 1, 2, 2, 3, 3]
    assert {_arg(s.argv, "--loader-jitter") for s in specs} == {jitter.loader_jitter}
    quick = configure(jitter, quick=True)
    assert quick.run_names() == ("ddp-loader", "dynamic-loader") and quick.steps >= 300
    assert not jitter.emulated  # the jitter is injected, but the devices are real


def test_an_emulated_input_cost_reaches_both_loops_and_is_labelled(tmp_path: Path) -> None:
    s = load_scenario("zoo-cpu-input-bound")
    assert s.emulated and any("EMULATED input cost" in x for x in s.emulation())
    for spec in run_specs(s, tmp_path, python="py"):
        assert _arg(spec.argv, "--input-cost-ms") == "1:6"
    arrives = load_scenario("zoo-neighbour-arrives")
    assert [lab for _, lab in arrives.change_steps] == [
        "neighbour arrives on GPU 1",
        "neighbour leaves GPU 1",
    ]
    assert {k.data_path for k in arrives.runs()} == {"loader", "device"}
    device = next(x for x in run_specs(arrives, tmp_path) if x.data_path == "device")
    assert "--num-workers" not in device.argv and device.num_workers == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("data_paths: [device]\nloader_jitter: '1'\n", r"loader_jitter: acts in DataLoader"),
        ("loader_jitter: 'mean_ms=1,spread=2'\n", r"loader_jitter: loader jitter: cannot"),
        ("input_cost_ms: '1:x'\n", r"input_cost_ms: input cost: cannot parse"),
        ("num_workers: [4, 4]\n", r"num_workers: a count is listed twice"),
        ("num_workers: [-1]\n", r"num_workers: expected a count >= 0"),
        ("repeats: 0\n", r"repeats: must be >= 1"),
        ("targets: [{metric: speed, min: 1}]\n", r"targets\[0\]\.metric: expected one of"),
        ("targets: [{metric: vs_ddp, max: 1}]\n", r"targets\[0\]: vs_ddp takes a min"),
        ("targets: [{metric: vs_ddp, min: 1, worker: 2}]\n", r"did you mean 'num_workers'"),
        ("quick: {repeat: 2}\n", r"quick: unknown key 'repeat'; did you mean 'repeats'"),
    ],
)
def test_scenario_mistakes_name_the_field(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_scenario("x", BASE + "data_paths: [loader]\n" * ("data_paths" not in extra) + extra)


def test_targets_pass_miss_or_say_not_measured_on_the_runs_they_name() -> None:
    (every, twelve, still) = parse_targets(
        [
            {"metric": "vs_ddp", "min": 1.0},
            {"metric": "vs_ddp", "min": 1.3, "num_workers": 12},
            {"metric": "plan_changes_per_20", "max": 1},
        ],
        "t",
    )
    rows = [
        {"run": "ddp-w8", "policy": "ddp", "num_workers": 8, "window": "steady"},
        {
            "run": "dyn-w8",
            "policy": "dynamic",
            "num_workers": 8,
            "window": "steady",
            "speedup_vs_ddp": 1.05,
            "plan_changes_per_20": 0.0,
        },
        {
            "run": "dyn-w12",
            "policy": "dynamic",
            "num_workers": 12,
            "window": "steady",
            "speedup_vs_ddp": 1.2,
            "plan_changes_per_20": None,
        },
    ]
    got = [(c["target"], c["run"], c["result"]) for c in check([every, twelve, still], rows)]
    assert got == [
        ("vs_ddp >= 1", "dyn-w8", "pass"),
        ("vs_ddp >= 1", "dyn-w12", "pass"),
        ("vs_ddp >= 1.3 (workers 12)", "dyn-w12", "miss"),
        ("plan_changes_per_20 <= 1", "dyn-w8", "pass"),
        ("plan_changes_per_20 <= 1", "dyn-w12", "n/a"),
    ]
    assert Target("settle_intervals", max=2).passes(2) and not Target("vs_ddp", min=1).passes(0.99)


def _record(rank: int, k: int, **kw: Any) -> dict[str, Any]:
    rec = {
        "step": 10 * (k + 1),
        "rank": rank,
        "time_s": 1000.0 + k,
        "interval_wall_s": 1.0,
        "samples_per_s": 100.0,
        "batch": 16,
        "steps_measured": 9,
        "compute_s": 0.05,
        "step_s": 0.1,
        "phases_s": {"data": 0.01, "optimizer": 0.002},
        "switch_s": None,
        "plan_changed": False,
        "reason": None,
    }
    return rec | kw


def test_a_changes_cost_is_its_costliest_ranks_switch_time_over_its_settled_step() -> None:
    ranks = [
        [_record(0, 0), _record(0, 1, switch_s=0.05), _record(0, 2, switch_s=0.02)],
        [_record(1, 0), _record(1, 1, switch_s=0.08), _record(1, 2, switch_steps=1.5)],
    ]
    assert figures.change_costs_steps(ranks) == [(20, pytest.approx(0.8)), (30, 1.5)]
    assert (
        figures.changes_per_intervals(3, 30) == 2.0 and figures.changes_per_intervals(1, 0) is None
    )


def test_why_the_plan_held_is_the_planners_not_helping_else_its_commonest_reason() -> None:
    reasons = [
        "within dead-band and noise (+0.3% predicted, needs > 2.0%)",
        "within dead-band and noise (-0.1% predicted, needs > 1.8%); speed change on rank(s) [1]",
        "does not pay back (0.10 ms/step x 100 steps < 30 ms switch)",
    ]
    rank0 = [_record(0, k, reason=r) for k, r in enumerate(reasons)]
    rank0.append(_record(0, 3, reason="predicted step 10 -> 9 ms", plan_changed=True))
    assert figures.why_held(rank0) == "within dead-band and noise (at 2 of 4 boundaries)"
    rank0[0]["not_helping"] = rank0[1]["not_helping"] = "devices alike"
    rank0[2]["not_helping"] = "the predicted gain did not show in the measured step time"
    assert (
        figures.why_held(rank0)
        == "hetero is not helping here: devices alike (at 2 of 4 boundaries)"
    )
    assert figures.why_held([_record(0, 0)]) is None  # plain DDP: no planner


def _write_pair_run(root: Path, name: str, repeat: int, rate: float, **kw: Any) -> None:
    """One run of a zoo pair: 20 intervals at ``rate`` (the first at half, the one after
    each plan change at 80%), its plans."""
    d = root / "runs" / name
    (d / "metrics").mkdir(parents=True)
    ddp = name.startswith("ddp")
    changes: list[int] = kw.get("changes", [])
    for rank in range(2):
        recs = [
            _record(
                rank,
                k,
                samples_per_s=rate * (0.5 if k == 0 else 0.8 if (k - 1) in changes else 1.0),
                plan_changed=k in changes,
                switch_s=0.03 if (k - 1) in changes else None,
                compute_s=None if ddp else 0.05,
                reason=None if ddp or rank else ("moved" if k in changes else "within dead-band"),
            )
            for k in range(20)
        ]
        (d / "metrics" / f"rank{rank}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in recs)
        )
    plans = [
        {"version": v, "apply_at_step": 0, "batches": [16, 16]} for v in range(len(changes) + 1)
    ]
    summary = {"final_plan": [16, 16], "plans": plans, "steps": 200, "num_workers": 6}
    (d / "summary.json").write_text(json.dumps(summary))
    outcome = {
        "name": name,
        "runner": "torch-ddp" if ddp else "hetero-api",
        "policy": "ddp" if ddp else "dynamic",
        "data_path": "loader",
        "num_workers": 6,
        "repeat": repeat,
        "returncode": 0,
        "error": None,
        "switches": [],
        "command": "x",
        "wall_s": 1.0,
    }
    (d / "run.json").write_text(json.dumps(outcome))


def test_the_report_checks_each_pair_against_its_targets_and_says_why_the_plan_held(
    tmp_path: Path,
) -> None:
    scenario = replace(load_scenario("zoo-alike-jitter"), repeats=2)
    names = list(scenario.run_names())
    manifest = {
        "scenario": asdict(scenario),
        "runs": names,
        "changes": [],
        "date": "2026-01-01T00:00:00+00:00",
        "device": "2x Test GPU",
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    _write_pair_run(tmp_path, "ddp-loader-r1", 1, 1000.0)
    _write_pair_run(tmp_path, "dynamic-loader-r1", 1, 995.0, changes=[5])
    _write_pair_run(tmp_path, "ddp-loader-r2", 2, 900.0)
    _write_pair_run(tmp_path, "dynamic-loader-r2", 2, 880.0, changes=[3, 9, 15])
    result = write_outputs(tmp_path, draw_plots=False)
    rows = {r["run"]: r for r in result["rows"]}
    one, two = rows["dynamic-loader-r1"], rows["dynamic-loader-r2"]
    assert one["speedup_vs_ddp"] == pytest.approx(0.995)  # against its own pair's DDP
    assert two["speedup_vs_ddp"] == pytest.approx(880 / 900)
    assert (one["intervals"], one["plan_changes_per_20"], two["plan_changes_per_20"]) == (20, 1, 3)
    assert one["change_costs_steps"] == [0.3] and one["change_cost_steps"] == 0.3
    assert one["whole_vs_steady"] == pytest.approx(18.8 / 19)  # one interval of 19 at 80%
    assert one["hold_reason"] == "within dead-band (at 19 of 20 boundaries)"
    got = {(c["run"], c["metric"]): c["result"] for c in result["targets"]}
    assert got == {
        ("dynamic-loader-r1", "vs_ddp"): "pass",
        ("dynamic-loader-r2", "vs_ddp"): "miss",
        ("dynamic-loader-r1", "plan_changes_per_20"): "pass",
        ("dynamic-loader-r2", "plan_changes_per_20"): "miss",
        ("dynamic-loader-r1", "change_cost_steps"): "pass",
        ("dynamic-loader-r2", "change_cost_steps"): "pass",
    }
    assert json.loads((tmp_path / "results.json").read_text())["targets"] == result["targets"]
    report = (tmp_path / "report.md").read_text()
    assert "## Targets (4 of 6 met)" in report
    assert "| vs_ddp >= 0.99 | dynamic-loader-r2 | steady | 0.98x | MISS |" in report
    assert "| dynamic-loader-r1 | 20 | 1.0 | 0.30 | 0.989 | within dead-band (at 19 of 20" in report
