"""``make demo``: a hetero cluster on this machine runs one job under ``equal`` and ``dynamic``.

A coordinator (SQLite in a temporary state directory) and three agents start as
real processes on loopback. Every agent offers this machine's CPU; node-b and
node-c are EMULATED 2x and 3x slower (an injected wait proportional to measured
compute, not real hardware). ``examples/demo.yaml`` is submitted twice, with
policy ``equal`` (plain DDP) and ``dynamic``; each run is followed to its end
and the two are printed side by side. Everything is stopped on exit.

The embedded demo (no control plane, ``hetero-train`` alone) is still
``python -m hetero.trainer.demo``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from hetero.bench.localcluster import AgentSpec, ClusterError, LocalCluster
from hetero.core.errors import HeteroError
from hetero.core.states import JobState, job_label
from hetero.trainer.demo import print_comparison
from hetero.v1 import coordinator_pb2 as pb

AGENTS = (AgentSpec("node-a"), AgentSpec("node-b", 2.0), AgentSpec("node-c", 3.0))
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"


def job_yaml(path: Path, policy: str, steps: int) -> str:
    """The example job with ``policy`` and ``steps``; the agents do the emulation."""
    spec = yaml.safe_load(path.read_text())
    spec.pop("emulate_slowdown", None)
    spec.update(policy=policy, steps=steps, name=f"demo-{policy}")
    return yaml.safe_dump(spec, sort_keys=False)


def summary_from_logs(lines: list[pb.LogLine]) -> dict[str, Any] | None:
    """Rank 0 prints its summary as JSON last (``hetero-train --json``)."""
    out = [x.text for x in lines if x.rank == 0 and x.stream == "stdout"]
    starts = [i for i, text in enumerate(out) if text == "{"]
    if not starts:
        return None
    try:
        result: dict[str, Any] = json.loads("\n".join(out[starts[-1] :]))
    except json.JSONDecodeError:
        return None
    return result


def run_policy(
    cluster: LocalCluster, console: Console, policy: str, steps: int, timeout_s: float
) -> dict[str, Any]:
    job_id = cluster.submit(job_yaml(EXAMPLE, policy, steps), source=str(EXAMPLE))
    console.print(f">> {policy}: job {job_id} submitted ({steps} steps)")
    t0 = time.perf_counter()
    shown = [-1]

    def progress(job: pb.Job) -> None:
        if job.last_step != shown[0] and job.last_step > 0:
            shown[0] = job.last_step
            console.print(
                f"   {policy:8} step {job.last_step:>4}/{steps}  plan {list(job.plan.batches)}"
                f"  (v{job.plan.version})  {time.perf_counter() - t0:5.1f} s"
            )

    job = cluster.wait(job_id, timeout_s, on_poll=progress)
    if JobState(job.state) is not JobState.SUCCEEDED:
        raise ClusterError(f"the {policy} job ended {job_label(job.state)}: {job.message}")
    summary = summary_from_logs(cluster.logs(job_id))
    if summary is None:
        raise ClusterError(f"the {policy} job finished but printed no summary")
    summary["plan_version"] = job.plan.version
    return summary


def print_results(console: Console, eq: dict[str, Any], dyn: dict[str, Any]) -> None:
    print_comparison(
        console,
        "equal vs dynamic through coordinator + 3 agents (heterogeneity EMULATED)",
        eq,
        dyn,
        extra_rows=[
            ("coordinator plan versions", str(eq["plan_version"]), str(dyn["plan_version"]))
        ],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hetero-demo", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="steps per run (default 150)")
    p.add_argument("--keep", type=Path, help="keep the cluster's state and logs here")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default 300)")
    args = p.parse_args(argv)
    console = Console()
    console.print(
        "[bold]hetero cluster demo[/bold]: coordinator + 3 agents on this machine (CPU, Gloo); "
        "node-b and node-c [bold]EMULATED[/bold] 2x and 3x slower"
    )
    with tempfile.TemporaryDirectory(prefix="hetero-demo-") as tmp:
        root = args.keep or Path(tmp)
        cluster = LocalCluster(root, AGENTS)
        try:
            cluster.start()
            console.print(
                f">> coordinator on {cluster.address}; agents registered (logs in {root})"
            )
            results = {
                policy: run_policy(cluster, console, policy, args.steps, args.timeout)
                for policy in ("equal", "dynamic")
            }
        except (HeteroError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        finally:
            cluster.stop()
    print_results(console, results["equal"], results["dynamic"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
