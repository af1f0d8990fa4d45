"""``make demo``: the same heterogeneous job under ``equal`` and ``dynamic``, side by side.

Three CPU ranks on this machine, ranks 1 and 2 emulated 2x and 3x slower (an
injected wait proportional to their measured compute: emulation, not real
hardware). Each policy runs as a real ``hetero-train`` job with Gloo.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

SLOWDOWN = "1:2,2:3"


def run_policy(policy: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    summary = out / policy / "summary.json"
    cmd = [
        sys.executable,
        "-m",
        "hetero.trainer.cli",
        "--nproc",
        "3",
        "--model",
        args.model,
        "--global-batch",
        str(args.global_batch),
        "--steps",
        str(args.steps),
        "--rebalance-interval",
        "10",
        "--policy",
        policy,
        "--emulate-slowdown",
        SLOWDOWN,
        "--output-dir",
        str(out / policy),
        "--summary-json",
        str(summary),
        "--json",
    ]
    print(f">> {policy}: {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: the {policy} run failed (exit {proc.returncode})")
    result: dict[str, Any] = json.loads(summary.read_text())
    return result


def print_comparison(
    console: Console,
    title: str,
    eq: dict[str, Any],
    dyn: dict[str, Any],
    extra_rows: Sequence[tuple[str, str, str]] = (),
) -> None:
    """The two summaries side by side, then dynamic's speedup over equal."""
    t = Table(title=title)
    t.add_column("")
    t.add_column("equal", justify="right")
    t.add_column("dynamic", justify="right")

    def rate(x: float | None) -> str:
        return f"{x:,.0f}" if x else "n/a"

    def pct(x: float | None) -> str:
        return f"{x:.0f}%" if x is not None else "n/a"

    t.add_row(
        "samples/s (steady)", rate(eq["steady_samples_per_s"]), rate(dyn["steady_samples_per_s"])
    )
    t.add_row("ideal samples/s", rate(eq["ideal_samples_per_s"]), rate(dyn["ideal_samples_per_s"]))
    t.add_row("% of ideal", pct(eq["pct_of_ideal"]), pct(dyn["pct_of_ideal"]))
    t.add_row("final plan", str(eq["final_plan"]), str(dyn["final_plan"]))
    for row in extra_rows:
        t.add_row(*row)
    console.print(t)
    if eq["steady_samples_per_s"]:
        speedup = dyn["steady_samples_per_s"] / eq["steady_samples_per_s"]
        console.print(
            f"dynamic is [bold]{speedup:.2f}x[/bold] equal's throughput (emulated heterogeneity)."
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hetero-demo", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--global-batch", type=int, default=192)
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--output-dir", help="keep the runs here (default: a temporary directory)")
    args = p.parse_args(argv)
    console = Console()
    console.print(
        f"[bold]hetero demo[/bold]: 3 CPU ranks, rank 1 and rank 2 [bold]emulated[/bold] 2x and 3x "
        f"slower ({SLOWDOWN}); {args.model}, global batch {args.global_batch}, {args.steps} steps"
    )
    with tempfile.TemporaryDirectory(prefix="hetero-demo-") as tmp:
        out = Path(args.output_dir or tmp)
        results = {policy: run_policy(policy, out, args) for policy in ("equal", "dynamic")}
    eq, dyn = results["equal"], results["dynamic"]
    loss_eq, loss_dyn = (f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}" for r in (eq, dyn))
    print_comparison(
        console,
        "equal vs dynamic (heterogeneity EMULATED on CPU)",
        eq,
        dyn,
        extra_rows=[("loss first -> last", loss_eq, loss_dyn)],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
