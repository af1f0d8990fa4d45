"""Language models on real Gloo ranks: exact gradients with uneven plans, OOM retry, the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetero.trainer.datasets.cifar import write_cifar
from hetero.trainer.sampler import epoch_permutation
from hetero.trainer.tasks import make_task

_spec = importlib.util.spec_from_file_location(
    "lm_equivalence_worker", Path(__file__).parent / "workers" / "lm_equivalence.py"
)
assert _spec and _spec.loader
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

pytestmark = pytest.mark.slow

TINY_LM = [
    "--model",
    "gpt2-tiny",
    "--dataset",
    "synthetic-text",
    "--seq-len",
    "16",
    "--num-samples",
    "480",
    "--global-batch",
    "24",
    "--lr",
    "3e-3",
    "--quiet",
    "--ideal-steps",
    "0",
    "--eval-samples",
    "48",
]


def _reference(steps: int) -> dict[str, torch.Tensor]:
    """One process over each whole global batch: what the ranks together must equal."""
    model = worker.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = worker.dataset()
    task = make_task("causal-lm")
    b = worker.GLOBAL_BATCH
    per_epoch = len(data) // b
    for step in range(steps):
        epoch, k = divmod(step, per_epoch)
        idx = epoch_permutation(len(data), 5, epoch)[k * b : (k + 1) * b]
        x, y = data.get_batch(idx, torch.device("cpu"))
        task.loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_gpt2_tiny_on_uneven_ranks_with_oom_retries_equals_one_process(run_ranks, tmp_path: Path):
    """Three ranks, uneven changing plans; ranks run out of memory (injected) at steps 3 and
    6, in forward and mid-backward. The retried steps re-cut the same samples, so the
    parameters are those of one process over each whole global batch."""
    mode = "oom"
    out = tmp_path / "params.pt"
    run_ranks("lm_equivalence.py", 3, str(out), mode)
    got = torch.load(out)
    sizes = [torch.load(f"{out}.rank{r}.sizes") for r in range(3)]
    assert all(sum(s) == 24 for s in zip(*sizes, strict=True))
    assert any(len(set(s)) > 1 for s in zip(*sizes, strict=True))
    assert [(e[0], sorted(e[1])) for e in got["events"]] == [(3, [0, 1]), (6, [2])]
    # The failed ranks got smaller batches from the retried step on.
    assert sizes[0][3] < 12 and sizes[1][3] < 8 and sizes[2][6] < 12
    ref = _reference(worker.STEPS)
    for name, value in ref.items():
        scale = max(value.abs().max().item(), 1.0)
        diff = (got["params"][name] - value).abs().max().item()
        assert diff <= 1e-5 * scale, f"{name}: max abs diff {diff:.3g}"


def _train(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hetero.trainer.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
    )


def test_simulated_nodes_with_zero_amp_checkpointing_and_an_oom(tmp_path: Path):
    """--simulate-nodes on CPU: the fraction is ignored with a notice; an injected OOM
    on rank 1 is retried; ZeRO, bf16 autocast, activation checkpointing and checkpoints
    all run; TensorBoard gets one event file per rank."""
    has_tb = importlib.util.find_spec("tensorboard") is not None
    out = tmp_path / "run"
    tb = ["--tensorboard", str(tmp_path / "tb")] if has_tb else []
    proc = _train(
        *TINY_LM,
        "--simulate-nodes",
        "2",
        "--memory-fraction",
        "0.3,0.6",
        "--oom-retry",
        "--zero",
        "--amp",
        "bf16",
        "--activation-checkpointing",
        "--steps",
        "12",
        "--rebalance-interval",
        "4",
        "--checkpoint-interval",
        "6",
        "--output-dir",
        str(out),
        "--summary-json",
        str(out / "summary.json"),
        *tb,
        env={"HETERO_INJECT_OOM": "1:5:backward"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "--memory-fraction ignored on CPU" in proc.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["simulated_nodes"] == 2 and s["memory_fraction"] == [0.3, 0.6]
    assert s["steps"] == 12 and s["zero"] is True and s["amp"] == "bf16"
    assert s["task"] == "causal-lm" and s["activation_checkpointing"] == "on"
    assert s["recompute"]["ranks"] == [True, True]  # on: every rank
    assert [e["step"] for e in s["oom_retries"]] == [5]
    assert s["final_plan"][1] <= s["oom_retries"][0]["failed"]["1"] * 0.75
    assert s["eval_split"] == "train" and 0 <= s["eval_accuracy"] <= 1
    assert (out / "checkpoints" / "last.pt").is_file()
    if has_tb:
        for rank in range(2):
            assert list((tmp_path / "tb" / f"rank{rank}").glob("events.out.tfevents.*"))


def test_bert_tiny_on_a_text_file_and_cifar10_train(tmp_path: Path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 40)
    proc = _train(
        *TINY_LM,
        "--model",
        "bert-tiny",
        "--dataset",
        "text",
        "--data-dir",
        str(text),
        "--steps",
        "6",
        "--amp",
        "fp16",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert s["task"] == "masked-lm" and s["steps"] == 6 and s["amp"] == "fp16"
    write_cifar(tmp_path / "cifar", "cifar10", train=96, test=20)
    proc = _train(
        "--model",
        "debug",
        "--image-size",
        "32",
        "--dataset",
        "cifar10",
        "--data-dir",
        str(tmp_path / "cifar"),
        "--global-batch",
        "16",
        "--steps",
        "6",
        "--ideal-steps",
        "0",
        "--quiet",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert s["eval_split"] == "test" and s["eval_samples"] == 20


def test_bench_compares_one_process_with_simulated_nodes(tmp_path: Path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.bench.cli",
            "simulate-nodes",
            "--nodes",
            "2",
            "--memory-fraction",
            "0.5",
            "--output-dir",
            str(tmp_path),
            "--",
            *TINY_LM,
            "--steps",
            "8",
            "--rebalance-interval",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "comparison.json").read_text())
    rows = {r["metric"]: r for r in report["rows"]}
    # Exact gradients: the same losses with one process and with two simulated nodes.
    assert rows["loss, last interval"]["single"] == rows["loss, last interval"]["simulated"]
    assert report["simulated_nodes"]["world_size"] == 2 and report["single"]["world_size"] == 1
    assert "SIMULATED" in (tmp_path / "comparison.md").read_text()
