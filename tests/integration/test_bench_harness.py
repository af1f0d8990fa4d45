"""hetero-bench run for real on CPU: the CI scenario end to end, and the neighbour's lifecycle.

The GPU paths differ from these only in the device string: the dynamic
neighbour test drives the same runner code (metrics tail, control file,
process-group stop) with the neighbour's matmuls on the CPU.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hetero.bench.harness.commands import SAFE_ENV, run_specs
from hetero.bench.harness.gpu_monitor import GpuMonitor
from hetero.bench.harness.neighbour import NeighbourProcess
from hetero.bench.harness.resize import configure
from hetero.bench.harness.runner import execute
from hetero.bench.harness.scenario import load_scenario
from hetero.bench.harness.scenariospec import Neighbour

pytestmark = pytest.mark.slow


def _neighbour_argv(tmp: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hetero.bench.harness.neighbour",
        "--device",
        "cpu",
        "--size",
        "32",
        "--control",
        str(tmp / "ctl"),
        "--log",
        str(tmp / "log.jsonl"),
        "--ready",
        str(tmp / "ready"),
    ]


def _events(log: Path) -> list[str]:
    return [json.loads(line)["event"] for line in log.read_text().splitlines()]


def _switches(log: Path) -> list[str]:
    return [e for e in _events(log) if e in ("on", "off")]


def _until_switched(log: Path, want: list[str], timeout_s: float = 30.0) -> None:
    """Wait until the neighbour has logged the switches ``want`` (it reads its control
    file every 20 ms, when it is scheduled: a loaded host may leave it waiting longer)."""
    deadline = time.monotonic() + timeout_s
    while (seen := _switches(log)) != want:
        assert seen == want[: len(seen)] and time.monotonic() < deadline, seen
        time.sleep(0.05)


def _neighbour(tmp_path: Path) -> NeighbourProcess:
    """A CPU neighbour that starts off, logging to ``log.jsonl``."""
    ctl, ready = tmp_path / "ctl", tmp_path / "ready"
    return NeighbourProcess(_neighbour_argv(tmp_path), ctl, ready, env=SAFE_ENV, start_on=False)


def test_neighbour_starts_switches_and_stops_leaving_no_process(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    nb = _neighbour(tmp_path)
    with nb:
        assert nb.alive()
        pid = nb.proc.pid if nb.proc else -1
        _until_switched(log, ["off"])  # its first read of the control file
        nb.switch(True)
        _until_switched(log, ["off", "on"])
        nb.switch(False)
        _until_switched(log, ["off", "on", "off"])
    assert not nb.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    events = _events(log)
    assert events[0] == "ready" and events[-1] == "exit"
    assert _switches(log) == ["off", "on", "off"]


def test_a_switch_returns_once_the_neighbour_has_seen_it(tmp_path: Path) -> None:
    """Switches written back to back (a harness that read two switches' steps in one
    look) each reach the neighbour: none is overwritten before it was read."""
    nb = _neighbour(tmp_path)
    with nb:
        for on in (True, False, True, False):
            nb.switch(on)
    assert _switches(tmp_path / "log.jsonl") == ["off", "on", "off", "on", "off"]


def test_neighbour_exits_when_its_parent_dies(tmp_path: Path) -> None:
    # A parent that starts the neighbour, then is killed without cleaning up.
    code = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen({_neighbour_argv(tmp_path)!r}); "
        "print(p.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail("the neighbour outlived its parent")
    assert "parent gone" in (tmp_path / "log.jsonl").read_text()


def test_dynamic_neighbour_is_switched_at_the_training_steps_beside_a_light_one(
    tmp_path: Path,
) -> None:
    base = configure(load_scenario("cpu-emulated"), quick=True, ideal_steps=0)
    scenario = replace(
        base,
        model="debug",
        ranks=2,
        slowdowns=(),
        # The neighbour on 0 is on for 180 steps (over half a second of this tiny model's
        # steps), so that it reads its control file while on, and the harness reads
        # step 10's record before step 190's, on a loaded host too: for 20 (60 ms) both
        # missed the window at times.
        steps=200,
        policies=("dynamic",),
        neighbours=(
            Neighbour(gpu=0, matmul_size=32, arrive_step=10, leave_step=190, device="cpu"),
            Neighbour(gpu=1, matmul_size=32, duty=0.2, device="cpu"),
        ),
    )
    (spec,) = [s for s in run_specs(scenario, tmp_path) if s.name == "dynamic"]
    outcome = execute(spec, scenario, GpuMonitor(0), timeout_s=120)
    assert outcome.ok, (outcome.error, (spec.out_dir / "stderr.log").read_text()[-2000:])
    switched = [(s["gpu"], s["step"], s["on"]) for s in outcome.switches]
    assert switched == [(0, 0, False), (1, 0, True), (0, 10, True), (0, 190, False)]
    record = json.loads((spec.out_dir / "run.json").read_text())
    assert record["switches"][2]["step"] == 10
    log = (spec.out_dir / "neighbour-gpu0.jsonl").read_text()
    assert '"event": "on"' in log and '"event": "exit"' in log
    light = [
        json.loads(x) for x in (spec.out_dir / "neighbour-gpu1.jsonl").read_text().splitlines()
    ]
    assert [r["event"] for r in light][:2] == ["ready", "on"] and light[-1]["event"] == "exit"


def test_cpu_emulated_quick_runs_end_to_end_and_writes_its_outputs(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.bench.cli",
            "run",
            "cpu-emulated",
            "--quick",
            "--steps",  # the outputs, not the figures: the quick run's 30 steps cut to 15
            "15",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    rows = doc["rows"]
    assert {r["policy"] for r in rows} == {"ddp", "dynamic"}
    for row in rows:
        assert row["scenario"] == "cpu-emulated" and row["emulated"] is True and row["ok"] is True
        assert row["samples_per_s"] and row["samples_per_s"] > 0
        for key in ("model", "pct_of_ideal", "speedup_vs_ddp", "device", "date"):
            assert key in row
    assert any(r["pct_of_ideal"] for r in rows)
    with (out / "results.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    report = (out / "report.md").read_text()
    assert "EMULATED" in report and "| dynamic |" in report


def test_gpu_machine_path_imports_nothing_it_lacks(tmp_path: Path) -> None:
    """The GPU machine has torch, pyyaml, nvidia-ml-py (and timm) but no rich, textual,
    sqlalchemy or matplotlib: hetero-train --json, the baselines, the zoo loops and
    hetero-bench report must not need them."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("rich", "textual", "sqlalchemy", "matplotlib"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from hetero.trainer.cli import main as train
from hetero.bench.baseline_ddp import main as baseline
from hetero.bench.harness import report, runner  # noqa: F401
common = ["--model", "debug", "--num-samples", "64", "--global-batch", "8", "--steps", "4",
          "--rebalance-interval", "2", "--ideal-steps", "1", "--amp", "bf16", "--channels-last"]
assert train([*common, "--json", "--quiet", "--output-dir", r"{tmp_path}/t"]) == 0
assert baseline([*common, "--output-dir", r"{tmp_path}/b"]) == 0
from hetero.bench.zoo.train import main as zoo
from hetero.bench.zoo.train_ddp import main as zoo_ddp
loop = ["--model", "debug", "--image-size", "8", "--num-classes", "4", "--num-samples", "64",
        "--global-batch", "8", "--steps", "4", "--rebalance-interval", "2", "--ideal-steps", "1",
        "--amp", "bf16", "--device", "cpu", "--data", "loader", "--num-workers", "0"]
assert zoo([*loop, "--output-dir", r"{tmp_path}/z"]) == 0
assert zoo_ddp([*loop, "--output-dir", r"{tmp_path}/d"]) == 0
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "b" / "metrics" / "rank0.jsonl").exists()
    assert (tmp_path / "z" / "metrics" / "rank0.jsonl").exists()
    assert "verdict: " in proc.stdout  # the zoo loops' own reports


def test_plain_ddp_baseline_trains_a_language_model_on_token_windows(tmp_path: Path) -> None:
    """The external baseline of the GPT-2 scenarios: causal LM on synthetic text, AdamW."""
    from hetero.bench.baseline_ddp import main as baseline

    out = tmp_path / "b"
    args = [
        "--model",
        "gpt2-tiny",
        "--dataset",
        "synthetic-text",
        "--seq-len",
        "32",
        "--global-batch",
        "8",
        "--steps",
        "12",
        "--rebalance-interval",
        "3",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--ideal-steps",
        "1",
        "--lr",
        "0.003",
        "--output-dir",
        str(out),
        "--summary-json",
        str(out / "summary.json"),
    ]
    assert baseline(args) == 0
    records = [json.loads(x) for x in (out / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6, 9, 12]
    assert records[-1]["loss"] < records[0]["loss"]  # it learns the token chain
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "gpt2-tiny" and len(summary["standalone_samples_per_s"]) == 2
