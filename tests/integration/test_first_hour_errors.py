"""A first hour's mistakes, each one line and a non-zero exit, printed where it is found
once: a global batch smaller than the ranks (``ctx.loader`` under a launcher, and
``hetero-train --nproc``), a data directory that is not there (``--dry-run``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetero.trainer.cli import main
from hetero.trainer.launch import launch_local

SCRIPT = """\
import torch
from torch.utils.data import TensorDataset
from hetero import trainer as ht

ctx = ht.init("equal", device="cpu")
ctx.loader(TensorDataset(torch.randn(16, 2)), global_batch=1)
"""


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_loader_global_batch_smaller_than_the_ranks_is_one_line_per_rank_not_a_traceback(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "mine.py"
    script.write_text(SCRIPT)
    code = launch_local([sys.executable, str(script)], 2, backend="gloo", timeout_s=120)
    err = capfd.readouterr().err
    assert code != 0
    assert "Traceback" not in err and "PlanError" not in err, err
    expected = "ctx.loader: global_batch 1 is smaller than 2 ranks x min_batch 1: give at least 2"
    mine = [line for line in _errors(err) if expected in line]
    # torch.distributed prefixes a rank's stderr lines with "[rankR]: " once its group formed
    assert len(mine) == 2 and all("error: " in line for line in mine), err


def test_hetero_train_nproc_prints_a_too_small_global_batch_once_before_any_rank_starts() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.trainer.cli",
            "--nproc",
            "2",
            "--model",
            "debug",
            "--global-batch",
            "1",
            "--steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert _errors(done.stderr) == [
        "error: --global-batch 1 is smaller than 2 ranks x min_batch 1: give at least 2"
    ]


def test_hetero_train_nproc_prints_caps_that_cannot_hold_the_global_batch_once() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.trainer.cli",
            "--nproc",
            "2",
            "--model",
            "debug",
            "--max-batch",
            "2",
            "--global-batch",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert _errors(done.stderr) == [
        "error: --max-batch 2: the ranks' memory caps (2, 2) cannot hold global_batch 8"
    ]


def test_dry_run_refuses_a_missing_data_dir_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--model", "debug", "--dataset", "cifar10", "--data-dir", "/nope", "--dry-run"])
    assert code == 2
    assert _errors(capsys.readouterr().err) == [
        "error: --data-dir '/nope' does not exist (--dataset cifar10)"
    ]


def test_dry_run_reads_the_data_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What only reading finds (a text file shorter than one sample) is the dataset's own line."""
    short = tmp_path / "short.txt"
    short.write_text("tiny")
    code = main(
        [
            "--model",
            "gpt2-tiny",
            "--dataset",
            "text",
            "--data-dir",
            str(short),
            "--seq-len",
            "16",
            "--dry-run",
        ]
    )
    err = _errors(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and "fewer than one sample of 17" in err[0], err


def test_dry_run_says_what_would_run_and_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--model",
            "debug",
            "--nproc",
            "3",
            "--global-batch",
            "12",
            "--steps",
            "5",
            "--emulate-slowdown",
            "2:3",
            "--output-dir",
            str(tmp_path / "run"),
            "--dry-run",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "dry run: debug on synthetic" in out and "3 ranks, global batch 12, 5 steps" in out
    assert "emulated slowdown 2:3" in out
    assert not (tmp_path / "run").exists()


def test_dry_run_checks_the_global_batch_against_nproc(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--model", "debug", "--nproc", "4", "--global-batch", "3", "--dry-run"])
    assert code == 2
    assert "--global-batch 3 is smaller than 4 ranks x min_batch 1" in capsys.readouterr().err


AGENT_SLOWED = """\
import os, sys
import torch
from torch.utils.data import TensorDataset
from hetero import trainer as ht

if os.environ["RANK"] == "1":  # as an agent with --emulate-slowdown 3 starts its rank
    os.environ["HETERO_EMULATE_SLOWDOWN"] = "3"
ctx = ht.init("equal", device="cpu", rebalance_interval=2)
model = ctx.wrap(torch.nn.Linear(2, 1))
loader = ctx.loader(TensorDataset(torch.randn(32, 2), torch.randn(32, 1)), global_batch=8)
for x, y in loader:
    ctx.backward(torch.nn.functional.mse_loss(model(x), y))
    ctx.step()
summary = ctx.report()
print("flag", ctx.rank, summary["emulated"], flush=True)
ctx.close()
"""


def test_report_says_emulated_when_only_another_ranks_environment_slowed_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "mine.py"
    script.write_text(AGENT_SLOWED)
    code = launch_local([sys.executable, str(script)], 2, backend="gloo", timeout_s=120)
    out = capfd.readouterr().out
    assert code == 0
    assert "flag 0 True" in out and "EMULATED" in out, out
