"""Measure the control plane: plan latency over loopback and its overhead on training.

``latency``: a coordinator and one agent as processes; a job is placed on a
node without an agent (so nothing runs it) and its plan is fetched N times
directly from the coordinator and N times through the agent's ``AgentLocal``,
plus ``ReportIntervalStats`` through the agent (what rank 0's worker thread
sends at a boundary: stored in SQLite, re-planned; each report names the plan
version of the previous answer, as from a trainer that ran every plan, so the
coordinator re-plans on every one). Prints p50/p99 in milliseconds.

``idle``: each daemon's CPU with no job running, over ``--seconds``.

``overhead``: the same ``hetero-train`` job (equal policy, so the work is
identical) run alone and under a coordinator with two agents, alternating;
prints seconds per step of each, their ratio (medians, and per alternating
pair), rank 0's time in the planner on the step path and its requests' round
trips (on the worker thread), and the CPU time the daemons used while the job ran.

Benchmarks, not tests: numbers go to docs/results-control-plane.md with the command and
the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.v1 import agent_pb2_grpc
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

TIMEOUT_S = 5.0
PARKED_JOB = """\
name: parked
model: debug
global_batch: 64
steps: 100
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 2
  device: cpu
  nodes: [no-agent]
"""


def _percentiles_ms(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "n": len(samples)}


def _time(fn: Callable[[], Any], n: int) -> list[float]:
    for _ in range(20):  # warm the channel
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def latency(n: int) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="hetero-latency-") as tmp,
        LocalCluster(Path(tmp), [AgentSpec("agent-node")]) as cluster,
    ):
        stub = cluster.stub
        stub.RegisterNode(
            pb.RegisterNodeRequest(
                name="no-agent",
                address="127.0.0.1",
                devices=[tpb.DeviceProfile(index=0, kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)],
            ),
            timeout=TIMEOUT_S,
        )
        job_id = cluster.submit(PARKED_JOB)
        nodes = stub.ListNodes(pb.ListNodesRequest(), timeout=TIMEOUT_S).nodes
        endpoint = next(x.agent_endpoint for x in nodes if x.name == "agent-node")
        req = tpb.GetPlanRequest(job_id=job_id)
        direct = _time(lambda: stub.GetPlan(req, timeout=TIMEOUT_S), n)
        with grpc.insecure_channel(endpoint) as channel:
            local = agent_pb2_grpc.AgentLocalStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
            via_agent = _time(lambda: local.GetPlan(req, timeout=TIMEOUT_S), n)
            step, version = [0], [1]

            def report() -> None:
                step[0] += 10
                r = tpb.IntervalReport(job_id=job_id, end_step=step[0], plan_version=version[0])
                for rank in range(2):
                    r.ranks.add(
                        rank=rank, batch=32, steps=9, compute_s=0.01 * (rank + 1), step_s=0.03
                    )
                version[0] = local.ReportIntervalStats(r, timeout=TIMEOUT_S).plan.version

            reports = _time(report, max(n // 5, 50))
    return {
        "GetPlan direct": _percentiles_ms(direct),
        "GetPlan via agent": _percentiles_ms(via_agent),
        "ReportIntervalStats via agent (stores + re-plans)": _percentiles_ms(reports),
    }


@dataclass(frozen=True)
class Workload:
    """The job both sides of ``overhead`` run: two ranks, equal policy, interval 10."""

    steps: int = 200
    model: str = "simple_cnn"
    global_batch: int = 64
    device: str = "cpu"

    def train_args(self, out: Path) -> list[str]:
        return [
            "--model",
            self.model,
            "--global-batch",
            str(self.global_batch),
            "--steps",
            str(self.steps),
            "--device",
            self.device,
            "--policy",
            "equal",
            "--rebalance-interval",
            "10",
            "--ideal-steps",
            "0",
            "--summary-json",
            str(out),
            "--quiet",
            "--json",
        ]

    def spec(self) -> str:
        return (
            f"name: overhead\nmodel: {self.model}\nglobal_batch: {self.global_batch}\n"
            f"steps: {self.steps}\npolicy: equal\nrebalance_interval: 10\n"
            f"resources:\n  ranks: 2\n  device: {self.device}\n"
        )


def _alone(work: Workload, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "hetero.trainer.cli", "--nproc", "2", *work.train_args(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _daemon_cpu_s(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds used so far by the coordinator and each agent process itself
    (not the ranks the agents launched)."""
    out = {}
    for name, proc in cluster.procs.items():
        times = psutil.Process(proc.pid).cpu_times()
        out[name] = times.user + times.system
    return out


def _under_control_plane(
    cluster: LocalCluster, work: Workload
) -> tuple[dict[str, Any], dict[str, float], float]:
    """The job's summary, each daemon's CPU seconds and the wall seconds from submit
    to finish."""
    from hetero.bench.demo import summary_from_logs

    spec = work.spec()
    cpu0, t0 = _daemon_cpu_s(cluster), time.perf_counter()
    # Polled every 2 s, not 0.5: each GetJob assembles the job's live view, and the
    # bench's own polling was a fifth of the coordinator's CPU it then charged the job.
    job = cluster.wait(cluster.submit(spec), timeout_s=600, period_s=2.0)
    wall_s = time.perf_counter() - t0
    cpu = {name: used - cpu0[name] for name, used in _daemon_cpu_s(cluster).items()}
    summary = summary_from_logs(cluster.logs(job.id))
    assert summary is not None and job.state == pb.JOB_STATE_SUCCEEDED, job.message
    return summary, cpu, wall_s


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def overhead(work: Workload, repeats: int) -> dict[str, Any]:
    """``repeats`` pairs of the job alone then under the control plane. On CUDA one
    agent holds both GPUs (two agents on one host would each offer both, and two
    ranks could land on one GPU); on the CPU two agents, one rank each."""
    alone: list[float] = []
    under: list[float] = []
    blocked: list[float] = []
    blocked_p50: list[float] = []
    rpc: list[float] = []
    daemon_cpu: list[float] = []
    busy: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="hetero-overhead-") as tmp:
        names = ["node-a"] if work.device == "cuda" else ["node-a", "node-b"]
        agents = [AgentSpec(name) for name in names]
        with LocalCluster(Path(tmp) / "cluster", agents) as cluster:
            for k in range(repeats):
                s = _alone(work, Path(tmp) / f"alone{k}.json")
                alone.append(s["train_wall_s"] / s["steps"])
                s, cpu, wall_s = _under_control_plane(cluster, work)
                under.append(s["train_wall_s"] / s["steps"])
                plane = s["control_plane"]
                # Before the worker thread, the round trip itself was on the step path.
                blocked.append(plane.get("blocked_s", plane["total_s"]) / s["steps"])
                blocked_p50.append(plane.get("blocked_p50_s", plane["p50_s"]))
                rpc.append(plane["total_s"] / s["steps"])
                daemon_cpu.append(sum(cpu.values()) / s["steps"])
                for name, used in cpu.items():
                    busy.setdefault(name, []).append(100 * used / wall_s)
    a, u = statistics.median(alone), statistics.median(under)
    ms = [[x * 1e3 for x in xs] for xs in (alone, under, blocked, blocked_p50, rpc, daemon_cpu)]
    return {
        "workload": asdict(work),
        "ms_per_step_alone": ms[0],
        "ms_per_step_under_control_plane": ms[1],
        "median_alone_ms": a * 1e3,
        "median_under_ms": u * 1e3,
        "ratio_of_medians": u / a,
        # Alone and under run back to back: each pair shares the box's load at the time.
        "ratio_per_pair": _spread([x / y for x, y in zip(under, alone, strict=True)]),
        # Inside rank 0: the planner's time on the step path, per step and per boundary
        # (before the report moved to a worker thread this was the whole round trip).
        "rank0_on_step_path_ms_per_step": _spread(ms[2]),
        "rank0_on_step_path_p50_ms_per_boundary": _spread(ms[3]),
        # Inside rank 0: round trips of its requests to the agent, per step (off the path).
        "rank0_request_round_trips_ms_per_step": _spread(ms[4]),
        # CPU time of the coordinator and both agents while the job ran: per step, and
        # each as % of one core. On this box they share its cores with the ranks.
        "daemons_cpu_ms_per_step": _spread(ms[5]),
        "daemon_cpu_percent_of_one_core": {name: _spread(xs) for name, xs in busy.items()},
    }


def idle(seconds: float) -> dict[str, float]:
    """Each daemon's CPU, in % of one core, over ``seconds`` with no job: a coordinator
    and two agents heartbeating and sampling telemetry, nothing else."""
    with tempfile.TemporaryDirectory(prefix="hetero-idle-") as tmp:
        agents = [AgentSpec("node-a"), AgentSpec("node-b")]
        with LocalCluster(Path(tmp) / "cluster", agents) as cluster:
            time.sleep(5.0)  # past registration and profiling
            before = _daemon_cpu_s(cluster)
            time.sleep(seconds)
            after = _daemon_cpu_s(cluster)
    return {name: 100 * (after[name] - before[name]) / seconds for name in before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hetero.bench.controlbench", description=__doc__.splitlines()[0]
    )
    sub = p.add_subparsers(dest="what", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("-n", type=int, default=1000)
    ovh = sub.add_parser("overhead")
    d = Workload()
    ovh.add_argument("--steps", type=int, default=d.steps)
    ovh.add_argument("--repeats", type=int, default=5)
    ovh.add_argument("--model", default=d.model, help=f"hetero-train --model (default {d.model})")
    ovh.add_argument("--global-batch", type=int, default=d.global_batch)
    ovh.add_argument("--device", choices=("cpu", "cuda"), default=d.device)
    idl = sub.add_parser("idle", help="the daemons' CPU with no job (%% of one core)")
    idl.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    if args.what == "latency":
        result: Any = latency(args.n)
    elif args.what == "idle":
        result = idle(args.seconds)
    else:
        work = Workload(args.steps, args.model, args.global_batch, args.device)
        result = overhead(work, args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
