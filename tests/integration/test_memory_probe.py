"""The start-up memory probe on real Gloo ranks: it changes nothing in training, its caps
bind from step 0, and a rank that cannot hold min_batch stops the job before step 0.

CPU ranks cannot measure a peak, so ``HETERO_PROBE_MEMORY`` has them report a known
line instead: the probe's passes (collective under DDP and FSDP2) still run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero.trainer.memprobe import INJECT_ENV
from hetero.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

RUN = ["--model", "debug", "--num-samples", "960", "--global-batch", "48", "--nproc", "2"]
RUN += ["--steps", "8", "--rebalance-interval", "2", "--ideal-steps", "0", "--eval-samples", "0"]
RUN += ["--policy", "equal"]


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics" / "rank0.jsonl")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shard", ["full", "none"])
def test_a_run_with_the_probe_has_the_losses_of_one_without(
    hetero_train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shard: str
) -> None:
    """Forward and backward twice more before step 0, through FSDP2's gathers and
    reduce-scatters or DDP's all-reduces, with caps far above the batch: every interval's
    loss is the same float."""
    monkeypatch.setenv(INJECT_ENV, "0:1e12:1e6:1e5,1:1e12:1e6:1e5")
    on, off = tmp_path / "on", tmp_path / "off"
    common = [*RUN, "--shard", shard, "--quiet"]
    a = hetero_train(*common, "--output-dir", str(on), "--summary-json", str(on / "s.json"))
    assert a.returncode == 0, a.stderr
    b = hetero_train(*common, "--output-dir", str(off), "--no-memory-probe")
    assert b.returncode == 0, b.stderr
    probed = json.loads((on / "s.json").read_text())["memory_probe"]
    assert [row["cap"] for row in probed] == [
        int((0.9e12 - 1e6 - row["optimizer_bytes"]) // 1e5) for row in probed
    ]
    got, ref = _losses(on), _losses(off)
    assert sorted(got) == [2, 4, 6, 8]
    assert got == ref


@pytest.mark.timeout(600)
def test_a_small_rank_gets_its_cap_from_step_0_and_one_too_small_stops_the_job(
    hetero_train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 holds 1 GB + 0.5 GB a sample under a 4 GB limit (10% margin): 5 samples, so
    the equal split of 48 becomes (43, 5) before the first step. Under a 1 GB limit it
    cannot hold one sample: a one-line error before step 0, naming the rank and the figures."""
    monkeypatch.setenv(INJECT_ENV, "1:4e9:1e9:5e8")
    out = tmp_path / "capped"
    a = hetero_train(
        *RUN, "--shard", "full", "--output-dir", str(out), "--summary-json", str(out / "s.json")
    )
    assert a.returncode == 0, a.stderr
    assert "memory probe caps [-, 5]" in a.stdout.splitlines()[0]
    summary = json.loads((out / "s.json").read_text())
    first = [p for p in summary["plans"] if p["apply_at_step"] == 0][-1]
    assert first["batches"] == [43, 5] and first["reason"].startswith("memory probe")
    assert all(r["batch"] == 43 for r in read_metrics(out / "metrics" / "rank0.jsonl"))

    monkeypatch.setenv(INJECT_ENV, "1:1e9:1e9:5e8")
    stopped = tmp_path / "stopped"
    b = hetero_train(*RUN, "--shard", "full", "--output-dir", str(stopped))
    assert b.returncode != 0
    errors = [line for line in b.stderr.splitlines() if line.startswith("error:")]
    assert errors and "Traceback" not in b.stderr, b.stderr
    assert "rank 1 (cpu) cannot hold min_batch 1: predicted 1.40 GiB" in errors[0]
    assert "limit 0.84 GiB" in errors[0]
    metrics = stopped / "metrics" / "rank0.jsonl"
    assert not metrics.exists() or not read_metrics(metrics)  # no interval ran


@pytest.mark.timeout(600)
def test_a_rank_whose_memory_binds_recomputes_alone_and_the_losses_stay_the_same(
    hetero_train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 holds 1 GB + 0.5 GB a sample under a 4 GB limit (5 samples), but only
    0.1 GB a sample recomputing (25): under auto it turns activation checkpointing on,
    alone, and runs the equal split; rank 0, with no cap, does not. Forced off, the
    same job caps rank 1 at 5 instead. Every interval's loss is the same to rounding."""
    monkeypatch.setenv(INJECT_ENV, "1:4e9:1e9:5e8:1e8")
    auto, off = tmp_path / "auto", tmp_path / "off"
    a = hetero_train(*RUN, "--output-dir", str(auto), "--summary-json", str(auto / "s.json"))
    assert a.returncode == 0, a.stderr
    assert "memory probe caps [-, 25]" in a.stdout.splitlines()[0]
    assert "rank 1 on: memory holds 5 of the 24 samples" in a.stdout
    summary = json.loads((auto / "s.json").read_text())
    assert summary["recompute"]["ranks"] == [False, True]
    assert summary["recompute"]["reasons"][0] == "off: no memory cap measured"
    assert summary["plans"][-1]["batches"] == [24, 24]
    b = hetero_train(
        *RUN,
        "--output-dir",
        str(off),
        "--summary-json",
        str(off / "s.json"),
        "--activation-checkpointing",
        "off",
    )
    assert b.returncode == 0, b.stderr
    forced = json.loads((off / "s.json").read_text())
    assert forced["recompute"]["ranks"] == [False, False]
    assert forced["plans"][-1]["batches"] == [43, 5]
    got, ref = _losses(auto), _losses(off)
    assert sorted(got) == [2, 4, 6, 8]
    assert got == pytest.approx(ref, rel=1e-5)
