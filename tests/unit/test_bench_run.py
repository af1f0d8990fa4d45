"""hetero-bench run/report without running anything: scenarios, commands, dry run, outputs."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest

from hetero.bench.cli import main
from hetero.bench.harness.commands import run_specs
from hetero.bench.harness.report import write_outputs
from hetero.bench.harness.resize import configure
from hetero.bench.harness.scenario import known_scenarios, load_scenario, parse_scenario
from hetero.core.errors import ConfigError
from hetero.core.gap import TERMS


def test_every_shipped_scenario_parses_and_the_issue_7_set_is_there() -> None:
    names = known_scenarios()
    for name in (
        "cpu-emulated",
        "gpu-neighbour",
        "gpu-neighbour-dynamic",
        "gpu-homogeneous",
        "gpu-cpu-hybrid",
    ):
        assert name in names
    for name in names:
        s = load_scenario(name)
        assert s.steps > 0 and s.run_names()
    assert load_scenario("cpu-emulated").emulated
    gpu = load_scenario("gpu-neighbour")
    assert (gpu.model, gpu.image_size, gpu.amp, gpu.global_batch) == ("resnet50", 224, "bf16", 512)


def test_resizing_keeps_change_steps_at_their_fraction_on_interval_boundaries() -> None:
    s = configure(load_scenario("gpu-neighbour-dynamic"), steps=150)
    assert s.neighbour is not None
    assert (s.neighbour.arrive_step, s.neighbour.leave_step) == (50, 100)
    quick = configure(load_scenario("cpu-emulated"), quick=True)
    assert quick.steps == 30 and quick.policies == ("dynamic",)
    assert [c for c, _ in quick.change_steps] == [10, 20]
    with pytest.raises(ConfigError, match="at least two rebalance intervals"):
        configure(load_scenario("gpu-neighbour"), steps=5)


def test_several_neighbours_of_different_weights() -> None:
    s = load_scenario("gpu-neighbour-4")
    assert [(n.gpu, n.weight) for n in s.neighbours] == [
        (1, "light (35% duty)"),
        (2, "heavy"),
        (3, "heavy"),
    ]
    assert s.ranks == s.gpus == 4 and s.change_steps == ()
    lm = load_scenario("gpu-neighbour-4-gpt2")
    assert (lm.model, lm.dataset, lm.seq_len) == ("gpt2-small", "synthetic-text", 1024)
    base = "devices: cuda\nranks: 2\ngpus: 2\nmodel: debug\nglobal_batch: 8\nsteps: 20\n"
    with pytest.raises(ConfigError, match="at most one neighbour per GPU"):
        parse_scenario("x", base + "neighbours: [{gpu: 1}, {gpu: 1}]\n")
    with pytest.raises(ConfigError, match=r"x.neighbour.duty: must be in \(0, 1\]"):
        parse_scenario("x", base + "neighbours: [{gpu: 1, duty: 0}]\n")
    with pytest.raises(ConfigError, match="either neighbour or neighbours"):
        parse_scenario("x", base + "neighbour: {gpu: 1}\nneighbours: [{gpu: 0}]\n")
    with pytest.raises(ConfigError, match=r"x.neighbours\[0\]: unknown key 'dutty'"):
        parse_scenario("x", base + "neighbours: [{gpu: 1, dutty: 0.5}]\n")


def test_scenario_errors_name_the_field() -> None:
    base = "devices: cpu\nranks: 2\ngpus: 0\nmodel: debug\nglobal_batch: 8\nsteps: 20\n"
    with pytest.raises(ConfigError, match=r"scenario x: unknown key 'stpes'; did you mean 'steps'"):
        parse_scenario("x", base + "stpes: 3\n")
    with pytest.raises(ConfigError, match=r"x.neighbour.gpu"):
        parse_scenario(
            "x", base.replace("cpu", "cuda").replace("gpus: 0", "gpus: 2") + "neighbour: {gpu: 2}\n"
        )
    with pytest.raises(ConfigError, match="unknown policy 'fastest'"):
        parse_scenario("x", base + "policies: [fastest]\n")
    with pytest.raises(ConfigError, match="leave_step"):
        parse_scenario(
            "x",
            base.replace("cpu", "cuda").replace("gpus: 0", "gpus: 2")
            + "neighbour: {gpu: 1, arrive_step: 10, leave_step: 30}\n",
        )
    with pytest.raises(ConfigError, match=r"x.offload: needs shard"):
        parse_scenario("x", base + "offload: params\n")
    with pytest.raises(ConfigError, match=r"x.offload: expected none or params, got 'optimizer'"):
        parse_scenario("x", base + "offload: optimizer\n")


def test_commands_run_as_modules_with_the_multicast_switches_off(tmp_path: Path) -> None:
    specs = run_specs(load_scenario("gpu-neighbour"), tmp_path, python="py")
    assert [s.name for s in specs] == ["ddp", "equal", "proportional", "dynamic", "hybrid"]
    for spec in specs:
        assert spec.argv[:2] == ("py", "-m")
        assert spec.env["NCCL_NVLS_ENABLE"] == "0"
        assert spec.env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert spec.env["NVSHMEM_DISABLE_NVLS"] == "1"
        for flag in ("--amp", "--channels-last", "--json"):
            assert flag in spec.argv or (spec.runner == "torch-ddp" and flag == "--json")
    hybrid = run_specs(load_scenario("gpu-cpu-hybrid"), tmp_path, python="py")
    by_name = {s.name: s for s in hybrid}
    assert by_name["gpu-only"].ranks == 1 and by_name["dynamic"].ranks == 3
    assert by_name["dynamic"].env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "gloo" in by_name["dynamic"].argv and by_name["equal"].steps == 4
    offload = run_specs(load_scenario("gpu-shard-offload-large"), tmp_path, python="py")
    for spec in offload:
        argv = " ".join(spec.argv)
        assert "--shard full --offload params" in argv, argv


def test_zoo_runs_each_policy_on_each_data_path_under_torchrun(tmp_path: Path) -> None:
    vit = load_scenario("zoo-vit")
    assert vit.run_names() == (
        "ddp-loader",
        "equal-loader",
        "dynamic-loader",
        "ddp-device",
        "equal-device",
        "dynamic-device",
    )
    specs = {s.name: s for s in run_specs(vit, tmp_path, python="py")}
    loader, device = specs["dynamic-loader"], specs["ddp-device"]
    assert (loader.policy, loader.data_path, loader.runner) == ("dynamic", "loader", "hetero-api")
    assert (device.policy, device.data_path, device.runner) == ("ddp", "device", "torch-ddp")
    assert loader.argv[:6] == (
        "py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    )
    assert loader.argv[6:8] == ("-m", "hetero.bench.zoo.train")
    assert device.argv[7] == "hetero.bench.zoo.train_ddp"
    for flag in ("--data", "--amp", "--num-classes"):
        assert flag in loader.argv
    assert loader.argv[loader.argv.index("--num-workers") + 1] == "6"
    assert "--num-workers" not in device.argv and "--policy" not in device.argv
    assert "--channels-last" in run_specs(load_scenario("zoo-convnext"), tmp_path)[0].argv
    quick = configure(load_scenario("zoo-cpu"), quick=True)
    assert quick.run_names() == ("ddp-loader", "dynamic-loader") and quick.emulated
    cpu = run_specs(quick, tmp_path)[1]
    assert cpu.env["CUDA_VISIBLE_DEVICES"] == "" and "--emulate-slowdown" in cpu.argv
    lm = run_specs(load_scenario("zoo-lm"), tmp_path)[0]
    assert lm.argv[lm.argv.index("--tokens") + 1] == str(tmp_path / "data" / "tokens.bin")
    base = "devices: cuda\nranks: 2\ngpus: 2\nmodel: debug\nglobal_batch: 8\nsteps: 20\n"
    with pytest.raises(ConfigError, match="the builtin loop gathers on the device only"):
        parse_scenario("x", base + "data_paths: [loader]\n")
    with pytest.raises(ConfigError, match="unknown data path 'disk'"):
        parse_scenario("x", base + "loop: zoo\ndata_paths: [disk]\n")
    with pytest.raises(ConfigError, match=r"x\.loop: expected one of builtin, zoo"):
        parse_scenario("x", base + "loop: script\n")


def test_unknown_scenario_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "gpu-neighbor"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: unknown scenario 'gpu-neighbor' (known: cpu-emulated, ")
    assert "did you mean 'gpu-neighbour'" in err


def test_dry_run_needs_no_torch_rich_or_matplotlib() -> None:
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("rich", "textual", "sqlalchemy", "matplotlib", "torch"):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        from hetero.bench.cli import main
        assert main(["run", "gpu-neighbour-dynamic", "--dry-run", "--out", "/tmp/x"]) == 0
        assert main(["run", "gpu-cpu-hybrid", "--dry-run", "--quick"]) == 0
        assert main(["run", "zoo-lm", "--dry-run", "--out", "/tmp/z"]) == 0
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "hetero.bench.harness.neighbour --device cuda:1 --size 8192" in out
    assert "switched on at the boundary >= step 100, off at >= step 200" in out
    assert "-m hetero.bench.baseline_ddp" in out and "--policy dynamic" in out
    assert "nothing below was run" in out
    assert "-m hetero.bench.zoo.tokens --out /tmp/z/data/tokens.bin --tokens 4194305" in out
    assert (
        "-m torch.distributed.run --standalone --nproc-per-node 2 -m hetero.bench.zoo.train " in out
    )


def _write_run(
    root: Path, name: str, runner: str, rates: list[float], switches: list[dict], ranks: int = 2
) -> None:
    d = root / "runs" / name
    (d / "metrics").mkdir(parents=True)
    for rank in range(ranks):
        with (d / "metrics" / f"rank{rank}.jsonl").open("w") as fh:
            for k, rate in enumerate(rates):
                compute = None if runner == "torch-ddp" else (0.1 if rank == 0 else 0.1 + 0.01 * k)
                rec = {
                    "step": 10 * (k + 1),
                    "rank": rank,
                    "time_s": 1000.0 + k,
                    "interval_wall_s": 1.0,
                    "samples_per_s": rate,
                    "batch": 8,
                    "steps_measured": 10,
                    "compute_s": compute,
                    "step_s": 0.2,
                }
                fh.write(json.dumps(rec) + "\n")
    (d / "summary.json").write_text(
        json.dumps(
            {
                "final_plan": [8, 8],
                "plans": [{}],
                "steps": 10 * len(rates),
                "ideal_samples_per_s": 200.0,
                "standalone_samples_per_s": [100.0, 100.0],
            }
        )
    )
    (d / "run.json").write_text(
        json.dumps(
            {
                "name": name,
                "runner": runner,
                "returncode": 0,
                "error": None,
                "switches": switches,
                "command": "x",
                "wall_s": 1.0,
            }
        )
    )
    (d / "gpu_util.jsonl").write_text(
        "".join(
            json.dumps({"time_s": 1000.0 + t, "util_pct": [90.0, 50.0]}) + "\n" for t in range(8)
        )
    )


def test_outputs_from_synthetic_runs_have_phases_speedups_and_adaptation(tmp_path: Path) -> None:
    scenario = configure(load_scenario("gpu-neighbour-dynamic"), steps=80)
    manifest = {
        "scenario": asdict(scenario),
        "runs": ["ddp", "dynamic"],
        "changes": [],
        "date": "2026-01-01T00:00:00+00:00",
        "device": "2x Test GPU",
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    sw = [{"step": 0, "on": False}, {"step": 30, "on": True}, {"step": 50, "on": False}]
    _write_run(tmp_path, "ddp", "torch-ddp", [50, 100, 100, 60, 60, 100, 100, 100], sw)
    _write_run(tmp_path, "dynamic", "hetero-train", [50, 100, 100, 70, 90, 100, 100, 100], sw)
    rows = write_outputs(tmp_path, draw_plots=False)["rows"]
    dyn = {r["window"]: r for r in rows if r["policy"] == "dynamic"}
    assert set(dyn) == {"p0", "p1", "p2", "whole-run"}
    assert dyn["p1"]["window_label"] == "neighbour arrives"
    assert dyn["p1"]["samples_per_s"] == 90 and dyn["p1"]["speedup_vs_ddp"] == pytest.approx(1.5)
    assert dyn["p1"]["adaptation_steps"] == 10
    assert dyn["p0"]["pct_of_ideal"] is None and dyn["p2"]["pct_of_ideal"] == pytest.approx(50.0)
    assert dyn["p2"]["gpu_util_pct"] == [90.0, 50.0]
    assert dyn["p2"]["imbalance"] is not None and dyn["p2"]["device"] == "2x Test GPU"
    # one GPU = plain DDP's fastest standalone rank (100/s): 100 / (2 x 100)
    assert dyn["p2"]["scaling_efficiency"] == pytest.approx(0.5)
    assert dyn["p2"]["predicted_samples_per_s"] is not None
    assert dyn["p2"]["prediction_error"] == pytest.approx(
        dyn["p2"]["predicted_samples_per_s"] / 100 - 1.0
    )
    ddp_rows = [r for r in rows if r["policy"] == "ddp"]
    assert all(r["predicted_samples_per_s"] is None for r in ddp_rows)
    doc = json.loads((tmp_path / "results.json").read_text())
    for row in doc["rows"]:
        for key in (
            "scenario",
            "model",
            "policy",
            "samples_per_s",
            "pct_of_ideal",
            "speedup_vs_ddp",
            "device",
            "date",
        ):
            assert key in row
    with (tmp_path / "results.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(rows) == 8
    report = (tmp_path / "report.md").read_text()
    assert "| dynamic | p1 neighbour arrives | 90 |" in report


def test_report_on_a_directory_without_a_manifest_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a hetero-bench run directory" in capsys.readouterr().err


def test_gpu_cpu_report_sets_the_planners_forecast_beside_the_gpu_alone_run(tmp_path: Path) -> None:
    scenario = load_scenario("gpu-cpu-hybrid")
    manifest = {
        "scenario": asdict(scenario),
        "runs": ["gpu-only", "dynamic"],
        "changes": [],
        "date": "2026-01-01T00:00:00+00:00",
        "device": "1x Test GPU + 2 CPU ranks",
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    _write_run(tmp_path, "gpu-only", "hetero-train", [3000.0] * 6, [], ranks=1)
    _write_run(tmp_path, "dynamic", "hetero-train", [1000.0] * 6, [], ranks=3)
    rows = write_outputs(tmp_path, draw_plots=False)["rows"]
    dyn = next(r for r in rows if r["policy"] == "dynamic")
    assert dyn["speedup_vs_gpu_only"] == pytest.approx(1 / 3)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [f["ranks"] for f in doc["exclusion_forecasts"]["dynamic"]] == [[1], [2], [1, 2]]
    report = (tmp_path / "report.md").read_text()
    assert "dynamic, planner forecast: excluding rank 1 would" in report
    assert "dynamic, planner forecast: excluding ranks 1, 2 would" in report
    assert "dynamic, the coordinator (`resources.allow_exclusion`, a checkpoint): " in report
    assert "forecast without every CPU rank against the measured GPU alone: " in report
    assert "the GPU alone ran 200% faster (3,000 vs 1,000 samples/s" in report


def _write_zoo_run(root: Path, policy: str, path: str, rate: float, compute: list[float]) -> None:
    """A zoo run's files: every rank's records with phases, a summary with the solo times."""
    name = f"{policy}-{path}"
    d = root / "runs" / name
    (d / "metrics").mkdir(parents=True)
    ddp = policy == "ddp"
    for rank, c in enumerate(compute):
        with (d / "metrics" / f"rank{rank}.jsonl").open("w") as fh:
            for k in range(6):
                rec = {
                    "step": 10 * (k + 1),
                    "rank": rank,
                    "time_s": 1000.0 + k,
                    "interval_wall_s": 10 * 32 / rate,
                    "samples_per_s": rate,
                    "batch": 16,
                    "steps_measured": 9,
                    "compute_s": None if ddp else c,
                    "step_s": 32 / rate - 1e-3,
                    "phases_s": {"data": 0.004 if path == "loader" else 0.0, "optimizer": 0.002},
                }
                fh.write(json.dumps(rec) + "\n")
    solo = [
        {
            "batch": 16,
            "samples_per_s": 16 / (c + 0.002),
            "data_s": 0.001,
            "compute_s": c,
            "optimizer_s": 0.002,
        }
        for c in (0.05, 0.1)
    ]
    ideal = sum(s["samples_per_s"] for s in solo)
    summary = {
        "final_plan": [16, 16],
        "plans": [{}],
        "steps": 60,
        "ideal_samples_per_s": ideal,
        "standalone_samples_per_s": [s["samples_per_s"] for s in solo],
        "solo": solo,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    outcome = {
        "name": name,
        "runner": "torch-ddp" if ddp else "hetero-api",
        "policy": policy,
        "data_path": path,
        "returncode": 0,
        "error": None,
        "switches": [],
        "command": "x",
        "wall_s": 1.0,
    }
    (d / "run.json").write_text(json.dumps(outcome))


def test_zoo_rows_carry_the_data_path_and_a_gap_breakdown_that_accounts_for_the_ideal(
    tmp_path: Path,
) -> None:
    scenario = load_scenario("zoo-cpu")
    runs = ["ddp-loader", "dynamic-loader", "ddp-device", "dynamic-device"]
    manifest = {
        "scenario": asdict(scenario),
        "runs": runs,
        "changes": [],
        "date": "2026-01-01T00:00:00+00:00",
        "device": "CPU",
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    _write_zoo_run(tmp_path, "ddp", "loader", 280.0, [0.05, 0.1])
    _write_zoo_run(tmp_path, "dynamic", "loader", 350.0, [0.07, 0.075])
    _write_zoo_run(tmp_path, "ddp", "device", 290.0, [0.05, 0.1])
    _write_zoo_run(tmp_path, "dynamic", "device", 380.0, [0.07, 0.075])
    rows = {r["run"]: r for r in write_outputs(tmp_path, draw_plots=False)["rows"]}
    assert set(rows) == set(runs)
    dyn = rows["dynamic-loader"]
    assert (dyn["policy"], dyn["data_path"]) == ("dynamic", "loader")
    assert dyn["speedup_vs_ddp"] == pytest.approx(350 / 280)  # against ddp-loader
    assert rows["dynamic-device"]["speedup_vs_ddp"] == pytest.approx(380 / 290)
    for row in rows.values():
        shares = [row[f"gap_{t}_pct"] or 0.0 for t in TERMS]
        # Over the window's wall time, the breakdown's % of ideal and its terms make 100.
        assert row["gap"]["pct_of_ideal"] + sum(shares) == pytest.approx(100.0)
        assert all(x >= 0 for x in shares) and row["gap_verdict"]
    assert rows["ddp-loader"]["gap_verdict"].startswith("imbalance: ")
    assert "equal batches leave rank 1 the slowest" in rows["ddp-loader"]["gap_verdict"]
    assert (
        rows["dynamic-loader"]["gap_input_wait_pct"] > rows["dynamic-device"]["gap_input_wait_pct"]
    )
    assert rows["dynamic-device"]["gap_input_wait_pct"] == pytest.approx(0.0)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert all(r["gap"]["terms"]["imbalance"]["ms_per_step"] is not None for r in doc["rows"])
    with (tmp_path / "results.csv").open() as fh:
        csv_rows = list(csv.DictReader(fh))
    assert {r["data_path"] for r in csv_rows} == {"loader", "device"}
    assert all(r["gap_verdict"] for r in csv_rows)
    report = (tmp_path / "report.md").read_text()
    assert "## Where the gap went (% of ideal)" in report
    assert "| dynamic-loader | steady |" in report and "verdict: " in report
    # hetero-bench report recomputes the same from the raw runs/ directory.
    again = {r["run"]: r for r in write_outputs(tmp_path, draw_plots=False)["rows"]}
    assert again["dynamic-loader"]["gap"] == dyn["gap"]
