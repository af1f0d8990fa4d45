"""hetero-top's state model: immutable views of the cluster built from coordinator messages.

The watch worker turns each ``ClusterSnapshot`` into a new ``ClusterState``
(carrying the recent telemetry history forward for the sparklines) on its own
thread and hands the frozen result to the UI thread, which only reads it.
Times come from the coordinator's clock (``time_unix_s`` of the snapshot), so
ages are the coordinator's view and tests with a fixed clock are reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.core.states import TERMINAL_LABELS, job_label, rank_label
from hetero.core.textsafe import printable
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

#: Telemetry samples kept per device for the sparklines (one per snapshot).
HISTORY = 60


def _opt(msg: object, name: str) -> float | None:
    return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]


@dataclass(frozen=True)
class DeviceView:
    node_id: str
    node_name: str
    index: int
    name: str
    kind: str  # "cuda" or "cpu"
    compute_score: float
    #: 1.0 = none; anything else means the device's speed is emulated.
    emulated_slowdown: float
    profile_memory_bytes: int | None
    utilization_percent: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    #: None = n/a; () = not throttled.
    throttle: tuple[str, ...] | None
    utilization_history: tuple[float, ...] = ()
    memory_history: tuple[float, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        return (self.node_id, self.index)

    @property
    def emulated(self) -> bool:
        return self.emulated_slowdown not in (0.0, 1.0)

    @property
    def memory_fraction(self) -> float | None:
        total = self.memory_total_bytes or self.profile_memory_bytes
        if self.memory_used_bytes is None or not total:
            return None
        return self.memory_used_bytes / total


@dataclass(frozen=True)
class NodeView:
    id: str
    name: str
    address: str
    status: str  # "up", "down" or "draining"
    draining: bool
    heartbeat_age_s: float
    cpu_percent: float | None
    devices: tuple[DeviceView, ...]


@dataclass(frozen=True)
class RankView:
    rank: int
    node_id: str
    node_name: str
    device_index: int
    device_name: str
    state: str
    emulated_slowdown: float
    #: The rank's batch in the job's current plan (None if the plan lacks it).
    batch: int | None


@dataclass(frozen=True)
class RankStats:
    """One rank over the newest interval: seconds per step, None = not measured."""

    rank: int
    batch: int
    steps: int
    compute_s: float
    step_s: float
    data_s: float | None
    forward_s: float | None
    backward_s: float | None
    comm_wait_s: float | None
    optimizer_s: float | None
    peak_memory_bytes: int | None

    @property
    def per_sample_s(self) -> float | None:
        return self.compute_s / self.batch if self.batch > 0 and self.steps > 0 else None


@dataclass(frozen=True)
class StragglerView:
    rank: int
    ratio: float
    intervals: int
    message: str


@dataclass(frozen=True)
class LiveView:
    end_step: int
    plan_version: int
    samples_per_s: float | None
    equal_samples_per_s: float | None
    ideal_samples_per_s: float | None
    loss: float | None
    emulated: bool
    ranks: tuple[RankStats, ...]
    stragglers: tuple[StragglerView, ...]


@dataclass(frozen=True)
class JobView:
    id: str
    name: str
    #: "queued", "pending", "running", "restarting", "succeeded", "failed", "cancelled"
    state: str
    policy: str
    global_batch: int
    world_size: int
    backend: str
    last_step: int
    total_steps: int | None
    restarts: int
    #: Why it failed or was cancelled, or, while queued, what it waits for.
    message: str
    plan_version: int
    ranks: tuple[RankView, ...]
    live: LiveView | None
    #: Who submitted it, as its credential is named ("user:ana"); "" if not known.
    owner: str = ""
    #: Who launched an attached job ("torchrun", "slurm job 42"); "" for one the
    #: coordinator placed.
    launcher: str = ""

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_LABELS

    @property
    def progress(self) -> float | None:
        if not self.total_steps:
            return None
        return min(self.last_step / self.total_steps, 1.0)

    @property
    def emulated(self) -> bool:
        return any(r.emulated_slowdown not in (0.0, 1.0) for r in self.ranks)


@dataclass(frozen=True)
class ClusterState:
    """Everything the cluster and jobs views show; ``time_unix_s`` is the coordinator's."""

    time_unix_s: float = 0.0
    nodes: tuple[NodeView, ...] = ()
    jobs: tuple[JobView, ...] = ()

    @property
    def devices(self) -> tuple[DeviceView, ...]:
        return tuple(d for n in self.nodes for d in n.devices)

    def job(self, job_id: str) -> JobView | None:
        return next((j for j in self.jobs if j.id == job_id), None)

    def device(self, node_id: str, index: int) -> DeviceView | None:
        return next((d for d in self.devices if d.key == (node_id, index)), None)

    def advance(self, snapshot: pb.ClusterSnapshot) -> ClusterState:
        """The state after ``snapshot``: telemetry history carried over from ``self``."""
        # The history lives in the devices themselves; a fresh dict keeps ``self`` untouched.
        history = {d.key: (d.utilization_history, d.memory_history) for d in self.devices}
        nodes = tuple(_node(n, snapshot.time_unix_s, history) for n in snapshot.nodes)
        jobs = tuple(job_view(j) for j in snapshot.jobs)
        return ClusterState(snapshot.time_unix_s, nodes, jobs)


def _node(
    n: pb.Node,
    now: float,
    history: dict[tuple[str, int], tuple[tuple[float, ...], tuple[float, ...]]],
) -> NodeView:
    telemetry = {t.device_index: t for t in n.telemetry}
    devices = []
    for d in n.devices:
        t = telemetry.get(d.index, tpb.DeviceTelemetry())
        util, used = _opt(t, "utilization_percent"), _opt(t, "memory_used_bytes")
        total = _opt(t, "memory_total_bytes") or _opt(d, "memory_bytes")
        util_h, mem_h = history.get((n.id, d.index), ((), ()))
        if util is not None:
            util_h = (*util_h, util)[-HISTORY:]
        if used is not None and total:
            mem_h = (*mem_h, 100.0 * used / total)[-HISTORY:]
        history[(n.id, d.index)] = (util_h, mem_h)
        devices.append(
            DeviceView(
                node_id=n.id,
                node_name=printable(n.name),
                index=d.index,
                name=printable(d.name),
                kind=str(tpb.DeviceKind.Name(d.kind)).removeprefix("DEVICE_KIND_").lower(),
                compute_score=d.compute_score,
                emulated_slowdown=d.emulated_slowdown or 1.0,
                profile_memory_bytes=d.memory_bytes if d.HasField("memory_bytes") else None,
                utilization_percent=util,
                memory_used_bytes=t.memory_used_bytes if t.HasField("memory_used_bytes") else None,
                memory_total_bytes=int(total) if total else None,
                temperature_c=_opt(t, "temperature_c"),
                power_w=_opt(t, "power_w"),
                throttle=tuple(t.throttle.reasons) if t.HasField("throttle") else None,
                utilization_history=util_h,
                memory_history=mem_h,
            )
        )
    status = "down" if not n.healthy else "draining" if n.draining else "up"
    return NodeView(
        id=n.id,
        name=printable(n.name),
        address=printable(n.address),
        status=status,
        draining=n.draining,
        heartbeat_age_s=now - n.last_heartbeat_unix_s,
        cpu_percent=_opt(n.host, "cpu_percent"),
        devices=tuple(devices),
    )


def rank_stats(r: tpb.RankIntervalStats) -> RankStats:
    return RankStats(
        rank=r.rank,
        batch=r.batch,
        steps=r.steps,
        compute_s=r.compute_s,
        step_s=r.step_s,
        data_s=_opt(r, "data_s"),
        forward_s=_opt(r, "forward_s"),
        backward_s=_opt(r, "backward_s"),
        comm_wait_s=_opt(r, "comm_wait_s"),
        optimizer_s=_opt(r, "optimizer_s"),
        peak_memory_bytes=r.peak_memory_bytes if r.HasField("peak_memory_bytes") else None,
    )


def job_view(j: pb.Job) -> JobView:
    batches = list(j.plan.batches)
    live = None
    if j.HasField("live"):
        lv = j.live
        live = LiveView(
            end_step=lv.end_step,
            plan_version=lv.plan_version,
            samples_per_s=_opt(lv, "samples_per_s"),
            equal_samples_per_s=_opt(lv, "equal_samples_per_s"),
            ideal_samples_per_s=_opt(lv, "ideal_samples_per_s"),
            loss=_opt(lv, "loss"),
            emulated=lv.emulated,
            ranks=tuple(rank_stats(r) for r in lv.ranks),
            stragglers=tuple(
                StragglerView(f.rank, f.ratio, f.intervals, printable(f.message))
                for f in lv.stragglers
            ),
        )
    return JobView(
        id=j.id,
        name=printable(j.name),
        state=job_label(j.state),
        policy=printable(j.policy),
        global_batch=j.global_batch,
        world_size=j.world_size,
        backend=printable(j.backend),
        last_step=j.last_step,
        total_steps=j.total_steps if j.HasField("total_steps") else None,
        restarts=j.restarts,
        message=printable(j.message),
        owner=printable(j.owner),
        launcher=printable(j.launcher),
        plan_version=j.plan.version,
        ranks=tuple(
            RankView(
                rank=r.rank,
                node_id=r.node_id,
                node_name=printable(r.node_name),
                device_index=r.device_index,
                device_name=printable(r.device_name),
                state=rank_label(r.state),
                emulated_slowdown=r.emulated_slowdown or 1.0,
                batch=batches[r.rank] if r.rank < len(batches) else None,
            )
            for r in j.ranks
        ),
        live=live,
    )
