"""hetero-train as a user runs it: summary, metrics, resume, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

TINY = ["--model", "debug", "--num-samples", "960", "--global-batch", "48", "--quiet"]


def test_emulated_three_rank_run_writes_summary_and_metrics(hetero_train, tmp_path: Path):
    out = tmp_path / "run"
    proc = hetero_train(
        *TINY,
        "--model",
        "simple_cnn",
        "--nproc",
        "3",
        "--steps",
        "40",
        "--rebalance-interval",
        "5",
        "--emulate-slowdown",
        "1:2,2:4",
        "--output-dir",
        str(out),
        "--summary-json",
        str(out / "summary.json"),
        "--ideal-steps",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads((out / "summary.json").read_text())
    for key in (
        "policy",
        "steps",
        "global_batch",
        "throughput_samples_per_s",
        "final_plan",
        "emulated",
        "ideal_samples_per_s",
        "ideal_method",
    ):
        assert key in s, key
    assert s["emulated"] is True and s["emulated_slowdown"] == "1:2x,2:4x"
    assert s["steps"] == 40 and sum(s["final_plan"]) == 48
    assert s["ideal_samples_per_s"] > 0 and len(s["standalone_samples_per_s"]) == 3
    assert "EMULATED" in proc.stdout
    # Each rank alone, phase by phase, and where the gap to the ideal went.
    assert [x["samples_per_s"] for x in s["solo"]] == s["standalone_samples_per_s"]
    assert all(x["compute_s"] > 0 and x["optimizer_s"] >= 0 for x in s["solo"])
    gap = s["gap"]
    assert len(gap["ranks"]) == 3 and gap["verdict"] and gap["last_step"] == 40
    # Every term ≥ 0, together the gap: the achieved share of the ideal and theirs make 100.
    assert gap["adds_up"] and all(t["ms_per_step"] >= 0 for t in gap["terms"].values())
    shares = sum(t["pct"] for t in gap["terms"].values())
    assert gap["pct_of_ideal"] + shares == pytest.approx(100.0)
    for rank in range(3):
        recs = read_metrics(out / "metrics" / f"rank{rank}.jsonl")
        assert [r["step"] for r in recs] == [5, 10, 15, 20, 25, 30, 35, 40]
        assert all(r["emulated"] for r in recs)
        assert all(r["gpu_util_percent"] is None and r["gpu_memory_percent"] is None for r in recs)
        assert {
            "loss",
            "samples_per_s",
            "batch",
            "phases_s",
            "compute_s",
            "peak_memory_bytes",
        } <= set(recs[0])
    # All ranks saw the same plan at every boundary.
    plans = [
        [r["plan"] for r in read_metrics(out / "metrics" / f"rank{k}.jsonl")] for k in range(3)
    ]
    assert plans[0] == plans[1] == plans[2]
    # Over the run, the 4x-slowed rank holds the smallest share on average. Neither the
    # final plan nor 1x against 2x is asserted: three ranks on two shared cores measure
    # each other's contention, and on a loaded box one interval's noise exceeds 4x
    # (final plans seen: [20, 27, 1], [16, 20, 12], [21, 9, 18]).
    mean = [sum(p[k] for p in plans[0][1:]) / len(plans[0][1:]) for k in range(3)]
    assert mean[2] < min(mean[:2]), plans[0]


@pytest.mark.parametrize("policy,rtol", [("equal", 1e-6), ("dynamic", 1e-4)])
def test_resume_gives_the_losses_of_an_uninterrupted_run(
    hetero_train, tmp_path: Path, policy: str, rtol: float
):
    common = [
        *TINY,
        "--nproc",
        "2",
        "--rebalance-interval",
        "4",
        "--policy",
        policy,
        "--ideal-steps",
        "0",
        "--checkpoint-interval",
        "8",
        "--emulate-slowdown",
        "1:3",
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    a = hetero_train(*common, "--steps", "24", "--output-dir", str(full))
    assert a.returncode == 0, a.stderr
    b = hetero_train(*common, "--steps", "8", "--output-dir", str(part))
    assert b.returncode == 0, b.stderr
    c = hetero_train(*common, "--steps", "24", "--output-dir", str(part), "--resume", "auto")
    assert c.returncode == 0, c.stderr
    ref = {r["step"]: r["loss"] for r in read_metrics(full / "metrics" / "rank0.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(part / "metrics" / "rank0.jsonl")}
    assert sorted(got) == [4, 8, 12, 16, 20, 24]
    for step in (12, 16, 20, 24):
        assert got[step] == pytest.approx(ref[step], rel=rtol), step


@pytest.mark.parametrize(
    "args,message",
    [
        (["--emulate-slowdown", "5:2", "--nproc", "2"], "rank 5"),
        (["--emulate-slowdown", "1:x"], "cannot parse"),
        (["--global-batch", "0"], "--global-batch: must be >= 1"),
        (["--resume", "/nonexistent/ckpt.pt"], "does not exist"),
        (["--dataset", "imagefolder"], "--data-dir: required when --dataset is imagefolder"),
        (
            ["--dataset", "imagefolder", "--data-dir", "/nonexistent"],
            "'/nonexistent' does not exist",
        ),
    ],
)
def test_bad_input_is_one_line_error_and_nonzero_exit(hetero_train, args, message):
    proc = hetero_train(*TINY, "--steps", "2", "--ideal-steps", "0", *args, timeout_s=120)
    assert proc.returncode != 0
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert any(message in line for line in err), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("resume_ranks", [2])
def test_a_checkpoint_resumes_on_fewer_ranks_with_the_losses_of_an_uninterrupted_run(
    hetero_train, tmp_path: Path, resume_ranks: int
):
    """What a job restarted after a lost node does: the sample order is global and the
    global batch unchanged, so fewer ranks continue the same training (debug: no BatchNorm)."""
    common = [*TINY, "--rebalance-interval", "4", "--policy", "dynamic", "--ideal-steps", "0"]
    common += ["--checkpoint-interval", "8"]
    full, part = tmp_path / "full", tmp_path / "part"
    a = hetero_train(*common, "--nproc", "3", "--steps", "24", "--output-dir", str(full))
    assert a.returncode == 0, a.stderr
    b = hetero_train(*common, "--nproc", "3", "--steps", "8", "--output-dir", str(part))
    assert b.returncode == 0, b.stderr
    c = hetero_train(
        *common,
        "--nproc",
        str(resume_ranks),
        "--steps",
        "24",
        "--output-dir",
        str(part),
        "--resume",
        "auto",
    )
    assert c.returncode == 0, c.stderr
    ref = {r["step"]: r["loss"] for r in read_metrics(full / "metrics" / "rank0.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(part / "metrics" / "rank0.jsonl")}
    for step in (12, 16, 20, 24):
        assert got[step] == pytest.approx(ref[step], rel=1e-4), step
    recs = read_metrics(part / "metrics" / f"rank{resume_ranks - 1}.jsonl")
    assert sum(recs[-1]["plan"]) == 48 and len(recs[-1]["plan"]) == resume_ranks


def test_resume_auto_without_a_checkpoint_yet_starts_from_step_zero(hetero_train, tmp_path: Path):
    out = tmp_path / "run"
    proc = hetero_train(
        *TINY,
        "--steps",
        "4",
        "--ideal-steps",
        "0",
        "--checkpoint-interval",
        "2",
        "--output-dir",
        str(out),
        "--resume",
        "auto",
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "checkpoints" / "last.pt").is_file()


def test_a_pipeline_job_of_two_replicas_resumes_with_the_losses_of_an_uninterrupted_run(
    hetero_train, tmp_path: Path
):
    """--pipeline 2 on 4 ranks: 2 replicas of 2 stages, a checkpoint every 8 steps (each a
    chance to re-cut the stages), resumed after 8: the loss is the uninterrupted run's."""
    common = [
        "--model",
        "gpt2-tiny",
        "--seq-len",
        "16",
        "--num-samples",
        "512",
        "--quiet",
        "--nproc",
        "4",
        "--pipeline",
        "2",
        "--global-batch",
        "16",
        "--rebalance-interval",
        "4",
        "--policy",
        "equal",
        "--checkpoint-interval",
        "8",
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    summary = tmp_path / "summary.json"
    a = hetero_train(
        *common, "--steps", "16", "--output-dir", str(full), "--summary-json", str(summary)
    )
    assert a.returncode == 0, a.stderr
    pipeline = json.loads(summary.read_text())["pipeline"]
    assert (pipeline["stages"], pipeline["replicas"], pipeline["blocks"]) == (2, 2, [1, 1])
    assert all(s is not None and s > 0 for s in pipeline["measured_stage_s"])
    b = hetero_train(*common, "--steps", "8", "--output-dir", str(part))
    assert b.returncode == 0, b.stderr
    c = hetero_train(*common, "--steps", "16", "--output-dir", str(part), "--resume", "auto")
    assert c.returncode == 0, c.stderr
    ref = {r["step"]: r["loss"] for r in read_metrics(full / "metrics" / "rank0.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(part / "metrics" / "rank0.jsonl")}
    assert sorted(got) == [4, 8, 12, 16]
    for step in (12, 16):
        assert got[step] == pytest.approx(ref[step], rel=1e-5), step
