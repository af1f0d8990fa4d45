"""The model-zoo loop for real on CPU: the CI scenario end to end under torchrun, and a
user's loop on a language model fed from a token file, through the public API.

Heterogeneity here is EMULATED (an injected wait on rank 1), and two ranks share
two cores: the figures show the path working, not hetero's quality.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.bench.zoo.tokens import write_tokens
from hetero.bench.zoo.train import main as train
from hetero.core.gap import TERMS

pytestmark = pytest.mark.slow


def test_zoo_cpu_quick_runs_both_loops_under_torchrun_with_a_gap_breakdown(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "hetero.bench.cli", "run", "zoo-cpu", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["run"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {"ddp-loader", "dynamic-loader"}
    for name, row in rows.items():
        assert row["ok"] and row["emulated"] and row["data_path"] == "loader", name
        assert row["samples_per_s"] > 0 and row["pct_of_ideal"] > 0
        gap = row["gap"]
        assert set(gap["terms"]) == set(TERMS) and gap["adds_up"]
        assert len(gap["ranks"]) == 2 and gap["verdict"] == row["gap_verdict"]
        shares = sum(t["pct"] or 0.0 for t in gap["terms"].values())
        assert gap["pct_of_ideal"] + shares == pytest.approx(100.0)
    assert rows["ddp-loader"]["runner"] == "torch-ddp"
    assert rows["dynamic-loader"]["runner"] == "hetero-api"
    assert rows["dynamic-loader"]["gap"]["terms"]["overlap"]["ms_per_step"] is not None
    # The user's script printed its own report on rank 0 (ctx.report()).
    log = (out / "runs" / "dynamic-loader" / "stdout.log").read_text()
    assert "zoo: hetero.trainer.models simple_cnn" in log and "data path loader (2 workers)" in log
    assert "gap to ideal, steps" in log and "\nverdict: " in log
    summary = json.loads((out / "runs" / "dynamic-loader" / "summary.json").read_text())
    assert summary["data_path"] == "loader" and len(summary["solo"]) == 2
    with (out / "results.csv").open() as fh:
        assert all(r["gap_verdict"] for r in csv.DictReader(fh))
    assert "## Where the gap went" in (out / "report.md").read_text()


@pytest.mark.parametrize("path", ["loader", "device"])
def test_a_language_model_learns_from_a_token_file_through_the_api(
    tmp_path: Path, path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens.bin"
    write_tokens(tokens, 20_000)
    out = tmp_path / path
    args = [
        "--model",
        "gpt2-tiny",
        "--tokens",
        str(tokens),
        "--seq-len",
        "32",
        "--data",
        path,
        "--num-workers",
        "1",
        "--global-batch",
        "8",
        "--steps",
        "20",
        "--device",
        "cpu",
        "--amp",
        "none",
        "--lr",
        "0.003",
        "--ideal-steps",
        "1",
        "--output-dir",
        str(out),
        "--summary-json",
        str(out / "summary.json"),
    ]
    assert train(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model_source"] == "hetero.trainer.models gpt2-tiny"
    assert summary["data_path"] == path and summary["ideal_samples_per_s"] > 0
    assert summary["gap"]["verdict"] and summary["solo"][0]["compute_s"] > 0
    records = [json.loads(x) for x in (out / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert records[-1]["loss"] < records[0]["loss"]  # it learns the generated text
    printed = capsys.readouterr().out
    assert "windows of 33 tokens" in printed and "verdict: " in printed
