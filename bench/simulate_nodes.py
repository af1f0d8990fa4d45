"""``hetero-bench simulate-nodes``: one process against N simulated nodes on one GPU.

Runs ``hetero-train`` twice with the same model, data, global batch and
steps: once as a single process with the whole device, once as
``--simulate-nodes N --memory-fraction F`` (N ranks on the device, each held
to its fraction of the memory). Then compares time per epoch, throughput,
peak memory per rank, convergence (loss per interval) and the final
evaluation loss and accuracy, and writes ``comparison.json`` and
``comparison.md`` under ``--output-dir`` next to both runs' outputs.

The simulated ranks share one GPU's compute: what the comparison shows is
how memory caps, plans and out-of-memory retries behave and that training
converges the same, not what N real nodes would gain. On a machine without
a GPU both runs use the CPU and the fraction is ignored (the runs say so).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hetero.core.errors import ConfigError, HeteroError

ROWS = (
    ("time per epoch (s)", "time_per_epoch_s", "{:.2f}"),
    ("throughput, steady (samples/s)", "steady_samples_per_s", "{:,.1f}"),
    ("peak memory, largest rank (MiB)", "peak_mib", "{:,.0f}"),
    ("loss, first interval", "loss_first", "{:.4f}"),
    ("loss, last interval", "loss_last", "{:.4f}"),
    ("eval loss", "eval_loss", "{:.4f}"),
    ("eval accuracy (%)", "eval_pct", "{:.2f}"),
    ("final plan", "final_plan", "{}"),
    ("memory caps (samples)", "memory_caps_text", "{}"),
    ("steps retried after OOM", "oom_count", "{}"),
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate-nodes",
        help="one process vs N simulated nodes sharing one GPU (memory-capped)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    p.add_argument(
        "--memory-fraction",
        default="0.23",
        help="each node's share of the GPU's memory, F or F0,F1,... (default 0.23)",
    )
    p.add_argument("--output-dir", required=True, help="both runs and the comparison go here")
    p.add_argument(
        "train_args",
        nargs=argparse.REMAINDER,
        help="after '--': hetero-train arguments for both runs (model, dataset, batch, steps, ...)",
    )
    p.set_defaults(func=run)


def _train(args: list[str], out: Path, timeout_s: float | None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "summary.json"
    cmd = [sys.executable, "-m", "hetero.trainer.cli", *args, "--output-dir", str(out)]
    cmd += ["--summary-json", str(summary), "--quiet"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    (out / "stdout.txt").write_text(proc.stdout)
    (out / "stderr.txt").write_text(proc.stderr)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise HeteroError(f"hetero-train in {out} failed ({proc.returncode}): {last[0]}")
    result: dict[str, Any] = json.loads(summary.read_text())
    return result


def _derive(s: dict[str, Any]) -> dict[str, Any]:
    peaks = s.get("per_rank_peak_memory_bytes") or []
    acc = s.get("eval_accuracy")
    return s | {
        "peak_mib": max(peaks) / 2**20 if peaks else None,
        "eval_pct": 100 * acc if acc is not None else None,
        "oom_count": len(s.get("oom_retries") or []),
    }


def compare(single: dict[str, Any], simulated: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Rows of (metric, single process, simulated nodes) as text."""
    a, b = _derive(single), _derive(simulated)
    rows = []
    for label, key, fmt in ROWS:
        cells = [fmt.format(x[key]) if x.get(key) is not None else "n/a" for x in (a, b)]
        rows.append((label, cells[0], cells[1]))
    return rows


def markdown(rows: list[tuple[str, str, str]], nodes: int, fraction: str, device: str) -> str:
    lines = [
        f"# One process vs {nodes} SIMULATED nodes on one {device} (memory fraction {fraction})",
        "",
        "| metric | one process | simulated nodes |",
        "| --- | --- | --- |",
        *[f"| {m} | {a} | {b} |" for m, a, b in rows],
        "",
        "The simulated nodes share one device's compute: compare memory, plans and convergence,",
        "not speed-up.",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if args.nodes < 2:
        raise ConfigError("--nodes must be >= 2")
    train_args = [a for a in args.train_args if a != "--"]
    for flag in ("--nproc", "--simulate-nodes", "--memory-fraction", "--output-dir"):
        if flag in train_args:
            raise ConfigError(
                f"{flag} is set by simulate-nodes; leave it out of the train arguments"
            )
    out = Path(args.output_dir)
    single = _train(train_args, out / "single", None)
    simulated = _train(
        [
            *train_args,
            "--simulate-nodes",
            str(args.nodes),
            "--memory-fraction",
            args.memory_fraction,
        ],
        out / "simulated",
        None,
    )
    rows = compare(single, simulated)
    report = {
        "nodes": args.nodes,
        "memory_fraction": args.memory_fraction,
        "device": simulated.get("device"),
        "simulated": True,
        "single": single,
        "simulated_nodes": simulated,
        "rows": [{"metric": m, "single": a, "simulated": b} for m, a, b in rows],
    }
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    md = markdown(rows, args.nodes, args.memory_fraction, str(simulated.get("device")))
    (out / "comparison.md").write_text(md)
    print(md, end="")
    return 0
