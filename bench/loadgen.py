"""One load-generator process of ``hetero-bench load``: many simulated agents and ranks.

Every simulated agent is a real gRPC client (``grpc.aio``, one channel per
process) doing what ``hetero-agent`` does: ``RegisterNode`` once, then at the
interval the registration's reply gives (or ``heartbeat_s``, where set) a
``Heartbeat`` with telemetry for its host and devices, and one ``WatchOrders`` stream
on which the coordinator pushes its orders: a launch is reported running, a stop
exited, as the agent would, and each order's push is timed (``WatchOrders``: from
the coordinator's send, ``Orders.sent_at_unix_s``, to its arrival here; one host,
one clock). The orders come from the orchestrator's churn (``loadrun``). Every simulated
job does what the trainer's rank 0 does: each ``interval_s`` one
``ReportIntervalStats`` carrying every rank's statistics (as the trainer sends after
its all-gather; the reply's plan reaches the other ranks by the trainer's own
broadcast, not through the coordinator). With ``get_plan_per_rank`` each rank then
also calls ``GetPlan`` (the load of this benchmark before 2026-11-28).

The schedule is open-loop without catch-up: a call starts at its slot, or at
once if the previous call of the same client ran past the slot; a saturated
coordinator therefore shows as achieved < offered, never as a burst.

Run by the orchestrator (``hetero.bench.loadrun``) as
``python -m hetero.bench.loadgen CONFIG.json``; it registers its agents, writes
``ready`` beside its config, waits for ``go.json`` (job ids and the measurement
window, in Unix seconds) and writes ``result.json``: raw per-call latencies of
calls started inside the window and when each started, and error counts per method
and status code.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from hetero.core import heap
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

GiB = 1 << 30
#: Seconds any one call may take before it counts as an error (the agent's own deadline).
CALL_TIMEOUT_S = 5.0
#: Seconds between looks for ``go.json``.
GO_POLL_S = 0.05
#: Error messages kept per process (counts are kept for all).
MAX_ERROR_SAMPLES = 20


@dataclass(frozen=True)
class WorkerConfig:
    """One process's share: agents ``first_agent .. first_agent + agents - 1`` and ``jobs``
    (indexes into the job list of ``go.json``)."""

    coordinator: str
    run_id: str
    first_agent: int
    agents: int
    devices_per_agent: int
    #: ``LoadConfig.heartbeat_s``: None = the interval the coordinator gives.
    heartbeat_s: float | None
    interval_s: float
    job_indexes: tuple[int, ...]
    seed: int
    #: ``LoadConfig.get_plan_per_rank``.
    get_plan_per_rank: bool = False

    @staticmethod
    def load(path: Path) -> WorkerConfig:
        raw = json.loads(path.read_text())
        raw["job_indexes"] = tuple(raw["job_indexes"])
        return WorkerConfig(**raw)


@dataclass
class Recorder:
    """Latencies (seconds) of calls started in ``[start, end)`` (Unix seconds), and errors."""

    start: float = math.inf
    end: float = math.inf
    latencies_s: dict[str, list[float]] = field(default_factory=dict)
    #: When each call of ``latencies_s`` started, in seconds after ``start`` (same order).
    starts_s: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    #: Calls of the window that were due but started late because the previous one overran.
    late: Counter[str] = field(default_factory=Counter)

    async def call(self, method: str, coro: Any) -> Any:
        started = time.time()
        t0 = time.perf_counter()
        try:
            result = await coro
        except grpc.aio.AioRpcError as exc:
            if self.start <= started < self.end:
                self.errors[f"{method}:{exc.code().name}"] += 1
                if len(self.error_samples) < MAX_ERROR_SAMPLES:
                    self.error_samples.append(f"{method}: {exc.code().name} {exc.details()}")
            return None
        if self.start <= started < self.end:
            self.latencies_s.setdefault(method, []).append(time.perf_counter() - t0)
            self.starts_s.setdefault(method, []).append(round(started - self.start, 4))
        return result


def device_profiles(n: int) -> list[tpb.DeviceProfile]:
    return [
        tpb.DeviceProfile(
            index=i,
            name="SimGPU (load test)",
            kind=tpb.DEVICE_KIND_CUDA,
            compute_score=100.0,
            memory_bytes=80 * GiB,
        )
        for i in range(n)
    ]


def heartbeat_request(node_id: str, devices: int, tick: int) -> pb.HeartbeatRequest:
    """Telemetry as a GPU node sends it: host CPU/RAM plus every field NVML gives per GPU."""
    wave = math.sin(tick / 7.0)
    return pb.HeartbeatRequest(
        node_id=node_id,
        host=tpb.HostTelemetry(
            cpu_percent=40.0 + 10 * wave, ram_used_bytes=100 * GiB, ram_total_bytes=512 * GiB
        ),
        devices=[
            tpb.DeviceTelemetry(
                device_index=i,
                utilization_percent=80.0 + 15 * wave,
                memory_used_bytes=60 * GiB,
                memory_total_bytes=80 * GiB,
                temperature_c=65.0 + 5 * wave,
                power_w=550.0 + 100 * wave,
                sm_clock_mhz=1980.0,
                throttle=tpb.ThrottleReasons(),
            )
            for i in range(devices)
        ],
    )


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


class Worker:
    def __init__(self, config: WorkerConfig, folder: Path) -> None:
        self.config = config
        self.folder = folder
        self.rec = Recorder()
        self.rng = random.Random(config.seed)
        self.stop_at = math.inf
        self.registered = 0
        #: Seconds between one agent's heartbeats, as registration set them.
        self.heartbeat_s = math.nan

    def _slots(self, method: str, period_s: float, next_at: float) -> float:
        """The next slot after ``next_at``; counts a late start inside the window."""
        now = time.time()
        if now > next_at + period_s / 2 and self.rec.start <= now < self.rec.end:
            self.rec.late[method] += 1
        return max(next_at + period_s, now)

    async def agent(self, stub: pb_grpc.CoordinatorStub, index: int) -> None:
        c = self.config
        name = f"load-{c.run_id}-{index:05d}"
        resp = None
        while resp is None and time.time() < self.stop_at:
            resp = await self.rec.call(
                "RegisterNode",
                stub.RegisterNode(
                    pb.RegisterNodeRequest(
                        name=name,
                        address=f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}",
                        agent_endpoint=f"{name}.local:7071",
                        agent_version="load-test",
                        devices=device_profiles(c.devices_per_agent),
                    ),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
        if resp is None:
            return
        self.registered += 1
        # As hetero-agent: the coordinator's interval unless one is imposed.
        period_s = c.heartbeat_s or resp.heartbeat_interval_s or 1.0
        self.heartbeat_s = period_s
        next_at = time.time() + self.rng.uniform(0, period_s)
        orders = asyncio.create_task(self.orders(stub, resp.node_id))
        tick = 0
        try:
            while True:
                await _sleep_until(next_at)
                if time.time() >= self.stop_at:
                    return
                tick += 1
                req = heartbeat_request(resp.node_id, c.devices_per_agent, tick)
                await self.rec.call("Heartbeat", stub.Heartbeat(req, timeout=CALL_TIMEOUT_S))
                next_at = self._slots("Heartbeat", period_s, next_at)
        finally:
            orders.cancel()

    async def orders(self, stub: pb_grpc.CoordinatorStub, node_id: str) -> None:
        """The node's order stream, as the agent keeps it: each push timed, a launch
        reported running and a stop exited; opened again after a pause if it ends."""
        while time.time() < self.stop_at:
            try:
                async for msg in stub.WatchOrders(pb.WatchOrdersRequest(node_id=node_id)):
                    arrived = time.time()
                    if self.rec.start <= msg.sent_at_unix_s < self.rec.end:
                        self.rec.latencies_s.setdefault("WatchOrders", []).append(
                            max(0.0, arrived - msg.sent_at_unix_s)
                        )
                        self.rec.starts_s.setdefault("WatchOrders", []).append(
                            round(msg.sent_at_unix_s - self.rec.start, 4)
                        )
                    for launch in msg.launches:
                        await self._status(
                            stub, node_id, launch.job_id, launch.rank, launch.attempt, None
                        )
                    for stop in msg.stops:
                        await self._status(stub, node_id, stop.job_id, stop.rank, stop.attempt, 143)
            except grpc.aio.AioRpcError as exc:
                if self.rec.start <= time.time() < self.rec.end:
                    self.rec.errors[f"WatchOrders:{exc.code().name}"] += 1
                await asyncio.sleep(1.0)

    async def _status(
        self,
        stub: pb_grpc.CoordinatorStub,
        node_id: str,
        job_id: str,
        rank: int,
        attempt: int,
        code: int | None,
    ) -> None:
        req = pb.ReportRankStatusRequest(
            node_id=node_id,
            job_id=job_id,
            rank=rank,
            attempt=attempt,
            state=pb.RANK_STATE_RUNNING if code is None else pb.RANK_STATE_EXITED,
        )
        if code is not None:
            req.exit_code = code
        await self.rec.call("ReportRankStatus", stub.ReportRankStatus(req, timeout=CALL_TIMEOUT_S))

    async def job(self, stub: pb_grpc.CoordinatorStub, job_id: str, world_size: int) -> None:
        """Rank 0's report each interval (and every rank's GetPlan after it where asked);
        batches follow the plan."""
        c = self.config
        speeds = [0.001 * (1 + r % 3) for r in range(world_size)]  # seconds per sample
        plan = await self.rec.call(
            "GetPlan", stub.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)
        )
        batches = list(plan.batches) if plan is not None else [1] * world_size
        version = plan.version if plan is not None else 0
        step = 0
        next_at = time.time() + self.rng.uniform(0, c.interval_s)
        while True:
            await _sleep_until(next_at)
            if time.time() >= self.stop_at:
                return
            step += 10
            report = tpb.IntervalReport(job_id=job_id, end_step=step, plan_version=version)
            # A real interval's times vary (3% here): identical reports would let the
            # coordinator reuse fits (``balancer.dynamic``) that it never can in use.
            compute = [
                (a * b + 0.002) * self.rng.uniform(0.97, 1.03)
                for a, b in zip(speeds, batches, strict=True)
            ]
            for rank, (b, t) in enumerate(zip(batches, compute, strict=True)):
                report.ranks.add(
                    rank=rank,
                    batch=b,
                    steps=10,
                    compute_s=t,
                    step_s=max(compute) + 0.004,
                    data_s=0.002,
                    comm_wait_s=max(compute) - t,
                    peak_memory_bytes=b * 50_000_000,
                    samples=10 * b,
                    loss_sum=2.0 * 10 * b,
                )
            resp = await self.rec.call(
                "ReportIntervalStats", stub.ReportIntervalStats(report, timeout=CALL_TIMEOUT_S)
            )
            if resp is not None and len(resp.plan.batches) == world_size:
                batches, version = list(resp.plan.batches), resp.plan.version
            if c.get_plan_per_rank:
                await asyncio.gather(
                    *(
                        self.rec.call(
                            "GetPlan",
                            stub.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=CALL_TIMEOUT_S),
                        )
                        for _ in range(world_size)
                    )
                )
            next_at = self._slots("ReportIntervalStats", c.interval_s, next_at)

    async def run(self) -> None:
        c = self.config
        async with grpc.aio.insecure_channel(c.coordinator) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            agents = [
                asyncio.create_task(self.agent(stub, c.first_agent + i)) for i in range(c.agents)
            ]
            while self.registered < c.agents:
                if all(t.done() for t in agents):
                    raise SystemExit(f"only {self.registered}/{c.agents} agents registered")
                await asyncio.sleep(GO_POLL_S)
            # A full collection of start-up's objects stalls this loop for up to 150 ms
            # on a loaded 2-core box, and every call in flight would count it as latency.
            heap.settle()
            (self.folder / "ready").write_text(str(self.registered))
            go_path = self.folder.parent / "go.json"
            while not go_path.exists():
                await asyncio.sleep(GO_POLL_S)
            go = json.loads(go_path.read_text())
            self.rec.start, self.rec.end = go["start_unix_s"], go["end_unix_s"]
            self.stop_at = self.rec.end
            jobs = [
                asyncio.create_task(self.job(stub, go["jobs"][i], go["world_size"]))
                for i in c.job_indexes
            ]
            await asyncio.gather(*agents, *jobs)
        result = {
            "latencies_s": self.rec.latencies_s,
            "starts_s": self.rec.starts_s,
            "errors": dict(self.rec.errors),
            "error_samples": self.rec.error_samples,
            "late": dict(self.rec.late),
            "agents": c.agents,
            "heartbeat_s": self.heartbeat_s,
            "jobs": len(c.job_indexes),
        }
        tmp = self.folder / "result.json.tmp"
        tmp.write_text(json.dumps(result))
        tmp.rename(self.folder / "result.json")


def main(argv: list[str]) -> int:
    config_path = Path(argv[0])
    asyncio.run(Worker(WorkerConfig.load(config_path), config_path.parent).run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
