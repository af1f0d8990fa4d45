"""Placement: a job's ranks onto healthy devices, its backend, rendezvous and first plan.

Pure functions over plain dataclasses: the servicer reads the devices from the
store, calls ``place``, and stores the result. Rules:

- a device is eligible if its node is healthy and not drained, is in ``resources.nodes`` (when
  given) and its kind is allowed (``device: cuda|cpu|any``, ``allow_cpu``);
- a CUDA device runs at most one rank of any active job; a CPU device may run
  several ranks (they share its cores), up to its ``capacity`` (the coordinator's
  ``ranks_per_cpu_device``), and ranks spread over the least-loaded CPU devices
  first;
- with ``device: any``, CUDA devices are used before CPU devices, fastest first;
- ranks are numbered node by node, so ``LOCAL_RANK`` counts within a node and
  rank 0 sits on the first node, whose address becomes ``MASTER_ADDR``;
- the backend is NCCL only if every rank is on CUDA, else Gloo;
- the initial plan is the job's policy's own over effective compute scores
  (hardware score divided by any emulated slowdown): equal for ``equal`` and
  ``dynamic``, from the scores for ``proportional`` and ``hybrid``
  (``initial_plan``); the proportional split is kept as ``Placement.plan`` for
  predictions;
- with the links measured between the job's nodes (``coordinator.peerlinks``) and a
  built-in model, whose size the catalogue knows, predictions count the gradient's
  all-reduce over the slowest link (``link_comm_s``), and a first plan from the
  profiles that gains too little once it is counted starts equal instead, saying
  "communication-bound" (``core.balancer.firstplan``);
- a sharded built-in job (``shard``) is refused when a CUDA device of known memory
  cannot hold its rank's share of the training state with ``memory_margin`` left
  free (``hetero.core.memfit.state_bytes_of``; activations come on top, measured).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetero.core.balancer import (
    Batches,
    Constraints,
    DeviceProfile,
    Link,
    equal_batches,
    equal_time_plan,
    link_comm_s,
    make_policy,
    predict_step_s,
)
from hetero.core.balancer.firstplan import (
    comm_in_score_units,
    communication_bound,
    profile_models,
)
from hetero.core.catalogue import model
from hetero.core.errors import HeteroError
from hetero.core.jobspec import JobSpec
from hetero.core.memfit import GIB, state_bytes_of


class PlacementError(HeteroError):
    """Not enough eligible devices for a job."""

    grpc_code = "FAILED_PRECONDITION"


@dataclass(frozen=True)
class DeviceSlot:
    """A device as placement sees it. ``compute_score`` is relative speed (larger = faster)."""

    node_id: str
    node_name: str
    node_address: str
    index: int
    kind: str
    name: str
    compute_score: float
    memory_bytes: int | None = None
    emulated_slowdown: float = 1.0
    healthy: bool = True
    #: Drained by an operator: no new ranks.
    draining: bool = False
    #: Ranks of active jobs already on this device.
    ranks_running: int = 0
    #: Ranks of active jobs the device may run at once; None = one on CUDA, no limit on
    #: CPU (the coordinator always sets it: ``ranks_per_cpu_device`` for CPU devices).
    capacity: int | None = None
    #: Ranks this device may run at once (None = no limit) and how many more it may take
    #: now (None = no limit): derived, kept as fields because an admission pass reads
    #: them for thousands of devices at every submission.
    max_ranks: int | None = field(init=False, repr=False, compare=False)
    room: int | None = field(init=False, repr=False, compare=False)
    #: ``(node_id, index)``, the device's key wherever devices are matched.
    key: tuple[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cap = self.capacity if self.capacity is not None else (1 if self.kind == "cuda" else None)
        object.__setattr__(self, "max_ranks", cap)
        object.__setattr__(self, "room", None if cap is None else max(cap - self.ranks_running, 0))
        object.__setattr__(self, "key", (self.node_id, self.index))


@dataclass(frozen=True)
class RankSlot:
    rank: int
    local_rank: int
    device: DeviceSlot
    #: Device emulation times the job's ``emulate_slowdown`` for this rank (1.0 = none).
    emulated_slowdown: float

    @property
    def effective_score(self) -> float:
        return self.device.compute_score / self.emulated_slowdown


@dataclass(frozen=True)
class Placement:
    ranks: tuple[RankSlot, ...]
    backend: str
    master_addr: str
    master_port: int
    plan: Batches

    @property
    def emulated(self) -> bool:
        return any(r.emulated_slowdown != 1.0 for r in self.ranks)

    def profiles(self) -> tuple[DeviceProfile, ...]:
        return profiles(self.ranks)


def profiles(ranks: Sequence[RankSlot]) -> tuple[DeviceProfile, ...]:
    """Balancer profiles in rank order; ``compute_score`` already has emulation applied
    (the balancer's proportional policy reads ``compute_score`` alone)."""
    return tuple(
        DeviceProfile(
            name=r.device.name,
            compute_score=r.effective_score,
            memory_bytes=r.device.memory_bytes,
            emulated_slowdown=r.emulated_slowdown,
        )
        for r in ranks
    )


@dataclass(frozen=True)
class Prediction:
    """A policy's plan and its predicted speed from hardware profiles alone.

    The step model is ``t_i(b) = b / score_i``, so ``samples_per_s`` is in the
    units of the compute scores: compare policies, not clusters. ``comm_s`` is the
    all-reduce over the measured links in seconds, counted in ``step_s`` in those
    units (``core.balancer.firstplan``); 0 where none is.
    """

    policy: str
    batches: Batches
    step_s: float
    samples_per_s: float
    emulated: bool
    comm_s: float = 0.0


def eligible(spec: JobSpec, device: DeviceSlot) -> bool:
    """Whether a rank of ``spec`` may go on ``device`` now."""
    if not device.healthy or device.draining or device.room == 0:
        return False
    return suitable(spec, device)


def suitable(spec: JobSpec, device: DeviceSlot) -> bool:
    """Whether ``spec`` may ever use ``device``: its kind and node, whatever its health
    or load."""
    res = spec.resources
    if res.nodes and device.node_name not in res.nodes:
        return False
    if device.kind == "cuda":
        return res.device in ("cuda", "any")
    if device.kind == "cpu":
        return res.device == "cpu" or (res.device == "any" and bool(res.allow_cpu))
    return False


def choose_devices(spec: JobSpec, devices: Sequence[DeviceSlot]) -> list[DeviceSlot]:
    """One device per rank, in rank order. Raises ``PlacementError`` if too few."""
    candidates = [d for d in devices if eligible(spec, d)]
    # The fastest CUDA devices first: the k best of thousands without sorting them all.
    chosen = heapq.nsmallest(
        spec.world_size,
        (d for d in candidates if d.kind == "cuda"),
        key=lambda d: (-d.compute_score, d.node_name, d.index),
    )
    cpus = [d for d in candidates if d.kind == "cpu"]
    load = {(d.node_id, d.index): d.ranks_running for d in cpus}

    def has_room(d: DeviceSlot) -> bool:
        return d.max_ranks is None or load[(d.node_id, d.index)] < d.max_ranks

    while len(chosen) < spec.world_size and (open_cpus := [d for d in cpus if has_room(d)]):
        pick = min(
            open_cpus,
            key=lambda d: (load[(d.node_id, d.index)], -d.compute_score, d.node_name, d.index),
        )
        load[(pick.node_id, pick.index)] += 1
        chosen.append(pick)
    if len(chosen) < spec.world_size:
        raise PlacementError(_shortage(spec, devices, len(chosen)))
    return sorted(chosen, key=lambda d: (d.node_name, d.kind != "cuda", d.index))


def _shortage(spec: JobSpec, devices: Sequence[DeviceSlot], found: int) -> str:
    res = spec.resources
    wanted = {"cuda": "free CUDA devices", "cpu": "CPU devices"}.get(res.device, "free devices")
    if res.device == "any" and not res.allow_cpu:
        wanted = "free CUDA devices (allow_cpu is false)"
    nodes = f" on nodes {', '.join(res.nodes)}" if res.nodes else ""
    healthy = len({d.node_id for d in devices if d.healthy})
    drained = len({d.node_id for d in devices if d.healthy and d.draining})
    drained_note = f", {drained} of them drained" if drained else ""
    return (
        f"job {spec.name!r} needs {spec.world_size} ranks but only {found} {wanted} "
        f"are available{nodes} ({healthy} healthy nodes{drained_note})"
    )


def place(spec: JobSpec, devices: Sequence[DeviceSlot], master_port: int) -> Placement:
    """Place ``spec`` on ``devices``; the caller chooses the rendezvous ``master_port``."""
    chosen = choose_devices(spec, devices)
    check_state_fits(spec, chosen)
    local: dict[str, int] = {}
    ranks = []
    for rank, device in enumerate(chosen):
        local_rank = local.get(device.node_id, 0)
        local[device.node_id] = local_rank + 1
        slowdown = device.emulated_slowdown * spec.emulate_slowdown[rank]
        ranks.append(RankSlot(rank, local_rank, device, slowdown))
    plan = make_policy("proportional").initial(constraints(spec), profiles(ranks))
    return Placement(
        ranks=tuple(ranks),
        backend="nccl" if all(d.kind == "cuda" for d in chosen) else "gloo",
        master_addr=chosen[0].node_address,
        master_port=master_port,
        plan=plan,
    )


def state_bytes(spec: JobSpec) -> float | None:
    """Predicted training state per rank on its device (bytes), for a sharded built-in job."""
    if not spec.builtin or spec.options.shard == "none":
        return None
    return state_bytes_of(spec.options, spec.world_size)


def check_state_fits(spec: JobSpec, chosen: Sequence[DeviceSlot]) -> None:
    """Refuse a sharded job when a chosen GPU cannot hold its share of the state."""
    need = state_bytes(spec)
    if need is None:
        return
    margin = spec.options.memory_margin
    for rank, d in enumerate(chosen):
        if d.kind == "cuda" and d.memory_bytes and need > d.memory_bytes * (1.0 - margin):
            raise PlacementError(
                f"job {spec.name!r}: rank {rank} on {d.node_name} GPU {d.index} ({d.name}, "
                f"{d.memory_bytes / GIB:.1f} GiB) cannot hold its {need / GIB:.2f} GiB share of "
                f"{spec.options.model}'s training state (shard {spec.options.shard} over "
                f"{spec.world_size} ranks, {margin:.0%} kept free): add ranks or offload params"
            )


@dataclass(frozen=True)
class InitialPlan:
    policy: str
    batches: Batches
    reason: str


def initial_plan(spec: JobSpec, placement: Placement, links: Sequence[Link] = ()) -> InitialPlan:
    """The job's first plan: its policy's own (``Policy.initial``), as the trainer's
    embedded planner starts. ``equal`` and ``dynamic`` start equal: ``equal`` remains
    the plain-DDP baseline, and ``dynamic`` moves on measurements only, from a plan
    it has measured (its do-no-harm guard compares every move with it); a split
    from hardware profiles taken on a loaded host put a job at 31:1 where 24:8 was
    right. ``proportional`` and ``hybrid`` start from the profiles
    (``placement.plan``), unless the all-reduce over the measured ``links`` between
    the job's nodes leaves that split too little to gain: then equal, and why."""
    equal = equal_batches(constraints(spec))
    batches = make_policy(spec.policy).initial(constraints(spec), profiles(placement.ranks))
    models = profile_models([r.effective_score for r in placement.ranks])
    seconds = comm_s(spec, links)
    why = communication_bound(batches, equal, models, _comm(spec, seconds), comm_s=seconds)
    if why:
        return InitialPlan(spec.policy, equal, why)
    if batches == equal:
        return InitialPlan(spec.policy, batches, "equal split (plain DDP)")
    return InitialPlan(spec.policy, batches, "initial plan from hardware profiles")


def constraints(spec: JobSpec) -> Constraints:
    return Constraints(spec.global_batch, spec.world_size, spec.min_batch)


def comm_s(spec: JobSpec, links: Sequence[Link]) -> float:
    """Seconds per step of the job's gradient all-reduce over the measured ``links``
    between its nodes (``link_comm_s``); 0 for a ``command:`` job, whose size is unknown."""
    parameters = model(spec.options.model).parameters if spec.builtin else 0
    return link_comm_s(parameters, spec.world_size, links) if parameters else 0.0


def _comm(spec: JobSpec, seconds: float) -> float:
    """``seconds`` (of a built-in job: ``comm_s``) in the profile models' units (``firstplan``)."""
    if seconds <= 0:
        return 0.0
    entry = model(spec.options.model)
    size = spec.options.image_size if entry.kind == "image" else spec.options.seq_len
    return comm_in_score_units(seconds, entry.train_flops_at(size))


def predict(
    spec: JobSpec, placement: Placement, links: Sequence[Link] = ()
) -> tuple[Prediction, ...]:
    """Predicted throughput of ``equal``, the initial (proportional) plan and ``dynamic``,
    the all-reduce over the measured ``links`` between the job's nodes counted."""
    models = profile_models([r.effective_score for r in placement.ranks])
    cons = constraints(spec)
    seconds = comm_s(spec, links)
    comm = _comm(spec, seconds)
    plans = {
        "equal": equal_batches(cons),
        "proportional": placement.plan,
        "dynamic": equal_time_plan(models, cons),
    }
    out = []
    for policy, batches in plans.items():
        step_s = predict_step_s(models, batches, comm_s=comm)
        out.append(
            Prediction(
                policy,
                batches,
                step_s,
                spec.global_batch / step_s,
                placement.emulated,
                seconds if comm > 0 else 0.0,
            )
        )
    return tuple(out)
