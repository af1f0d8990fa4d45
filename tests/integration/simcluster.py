"""A simulated cluster that talks to a real coordinator with real gRPC clients.

It plays the node agents and the trainers: registers nodes with device
profiles, sends heartbeats with telemetry, submits a job, reports its ranks
running and sends interval statistics whose compute times follow fixed
per-sample speeds, so the coordinator re-plans and flags the slow rank.
Everything is a function of the step, so runs are reproducible.

Also a script, to drive ``hetero-top`` by hand::

    hetero-coord serve --listen 127.0.0.1:7070 --db sqlite:////tmp/h.db &
    python tests/integration/simcluster.py --coordinator 127.0.0.1:7070
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import grpc

from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
GiB = 1 << 30

JOB_SPEC = """\
name: resnet-mixed
model: simple_cnn
global_batch: 96
steps: 400
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 3
  device: cuda
"""

SMALL_JOB_SPEC = """\
name: cpu-smoke
model: simple_cnn
global_batch: 32
steps: 100
policy: equal
rebalance_interval: 10
resources:
  ranks: 1
  device: cpu
"""


@dataclass(frozen=True)
class SimDevice:
    index: int
    name: str
    kind: int
    score: float
    memory_bytes: int
    #: Compute seconds per sample the simulated trainer reports on this device.
    per_sample_s: float
    emulated_slowdown: float = 1.0


@dataclass(frozen=True)
class SimNode:
    name: str
    devices: tuple[SimDevice, ...]


CLUSTER = (
    SimNode(
        "gpu-a",
        (
            SimDevice(0, "NVIDIA H100 80GB", tpb.DEVICE_KIND_CUDA, 100.0, 80 * GiB, 0.0010),
            SimDevice(1, "NVIDIA L4", tpb.DEVICE_KIND_CUDA, 30.0, 24 * GiB, 0.0032),
        ),
    ),
    SimNode(
        "gpu-b",
        (SimDevice(0, "NVIDIA A100 40GB", tpb.DEVICE_KIND_CUDA, 60.0, 40 * GiB, 0.0040, 2.0),),
    ),
    SimNode("cpu-c", (SimDevice(0, "cpu", tpb.DEVICE_KIND_CPU, 1.0, 64 * GiB, 0.05),)),
)


def watch_orders(stub: pb_grpc.CoordinatorStub, node_id: str) -> pb.Orders:
    """A node's orders as its agent's stream opens with them: every message of the first
    burst, merged (``Orders.complete`` ends it)."""
    merged = pb.Orders()
    call = stub.WatchOrders(pb.WatchOrdersRequest(node_id=node_id), timeout=DEADLINE_S)
    for msg in call:
        merged.launches.extend(msg.launches)
        merged.stops.extend(msg.stops)
        if msg.complete:
            call.cancel()
            break
    return merged


class SimCluster:
    """The agents and trainers of ``CLUSTER``, over one channel to ``address``."""

    def __init__(self, address: str, nodes: tuple[SimNode, ...] = CLUSTER) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.nodes = nodes
        self.node_ids: dict[str, str] = {}
        self.tick = 0

    def close(self) -> None:
        self.channel.close()

    def register(self) -> None:
        for node in self.nodes:
            resp = self.stub.RegisterNode(
                pb.RegisterNodeRequest(
                    name=node.name,
                    address=f"{node.name}.local",
                    agent_endpoint=f"{node.name}.local:7071",
                    agent_version="sim",
                    devices=[
                        tpb.DeviceProfile(
                            index=d.index,
                            name=d.name,
                            kind=d.kind,
                            compute_score=d.score,
                            memory_bytes=d.memory_bytes,
                            emulated_slowdown=d.emulated_slowdown,
                        )
                        for d in node.devices
                    ],
                ),
                timeout=DEADLINE_S,
            )
            self.node_ids[node.name] = resp.node_id

    def heartbeat(self, skip: tuple[str, ...] = ()) -> None:
        """One heartbeat per node (except ``skip``), telemetry a function of the tick."""
        self.tick += 1
        for n, node in enumerate(self.nodes):
            if node.name in skip:
                continue
            devices = []
            for d in node.devices:
                wave = math.sin((self.tick + 3 * n + d.index) / 2.0)
                t = tpb.DeviceTelemetry(
                    device_index=d.index,
                    utilization_percent=round(70 + 25 * wave, 1),
                    memory_used_bytes=int(d.memory_bytes * (0.55 + 0.2 * wave)),
                    memory_total_bytes=d.memory_bytes,
                )
                if d.kind == tpb.DEVICE_KIND_CUDA:
                    t.temperature_c = round(60 + 10 * wave, 1)
                    t.power_w = round(250 + 80 * wave, 1)
                    t.sm_clock_mhz = 1755.0
                    t.throttle.SetInParent()
                devices.append(t)
            self.stub.Heartbeat(
                pb.HeartbeatRequest(
                    node_id=self.node_ids[node.name],
                    host=tpb.HostTelemetry(
                        cpu_percent=35.0 + 5 * n, ram_used_bytes=40 * GiB, ram_total_bytes=256 * GiB
                    ),
                    devices=devices,
                ),
                timeout=DEADLINE_S,
            )

    def submit(self, spec: str = JOB_SPEC) -> pb.Job:
        return self.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S).job

    def start(self, job: pb.Job) -> None:
        for r in job.ranks:
            self.stub.ReportRankStatus(
                pb.ReportRankStatusRequest(
                    node_id=r.node_id, job_id=job.id, rank=r.rank, state=pb.RANK_STATE_RUNNING
                ),
                timeout=DEADLINE_S,
            )

    def _device(self, r: pb.RankPlacement) -> SimDevice:
        node = next(n for n in self.nodes if n.name == r.node_name)
        return next(d for d in node.devices if d.index == r.device_index)

    def train(self, job: pb.Job, intervals: int, steps_per_interval: int = 10) -> tpb.Plan:
        """Report ``intervals`` intervals at the current plan; returns the last plan."""
        plan = job.plan
        per_sample = [self._device(r).per_sample_s for r in job.ranks]
        start = job.last_step
        for i in range(1, intervals + 1):
            end_step = start + i * steps_per_interval
            report = tpb.IntervalReport(job_id=job.id, end_step=end_step, plan_version=plan.version)
            compute = [a * b + 0.002 for a, b in zip(per_sample, plan.batches, strict=True)]
            slowest = max(compute)
            for rank, (b, c) in enumerate(zip(plan.batches, compute, strict=True)):
                comm_wait = slowest - c + 0.004
                data, opt = 0.002 + 0.00002 * b, 0.003
                loss = 2.3 * math.exp(-end_step / 150.0) + 0.1
                report.ranks.add(
                    rank=rank,
                    batch=b,
                    steps=steps_per_interval,
                    compute_s=c,
                    step_s=data + c + comm_wait + opt,
                    data_s=data,
                    forward_s=c / 3,
                    backward_s=2 * c / 3,
                    comm_wait_s=comm_wait,
                    optimizer_s=opt,
                    peak_memory_bytes=b * 60_000_000,
                    loss_sum=loss * b * steps_per_interval,
                    samples=b * steps_per_interval,
                )
            plan = self.stub.ReportIntervalStats(report, timeout=DEADLINE_S).plan
        return plan

    def job(self, job_id: str) -> pb.Job:
        return self.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)


def populate(sim: SimCluster, intervals: int = 8) -> pb.Job:
    """Register, heartbeat, run a 3-rank CUDA job for ``intervals`` intervals and leave a
    small CPU job pending; returns the big job as the coordinator now sees it."""
    sim.register()
    for _ in range(3):
        sim.heartbeat()
    job = sim.submit()
    sim.start(job)
    sim.train(job, intervals)
    sim.submit(SMALL_JOB_SPEC)
    return sim.job(job.id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default="127.0.0.1:7070")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between heartbeats")
    args = parser.parse_args()
    sim = SimCluster(args.coordinator)
    job = populate(sim)
    print(f"job {job.id} running; heartbeats every {args.period:g} s (Ctrl-C stops)")
    try:
        while True:
            time.sleep(args.period)
            sim.heartbeat()
            if sim.tick % 3 == 0:
                sim.train(job, 1)
                job = sim.job(job.id)
    except KeyboardInterrupt:
        pass
    finally:
        sim.close()


if __name__ == "__main__":
    main()
