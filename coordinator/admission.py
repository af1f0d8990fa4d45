"""Admission: which submitted jobs the coordinator takes, and which queued job runs next.

Pure functions over ``placement``'s dataclasses; the store reads the queue and the
devices, calls :func:`admit`, and writes the decisions. The rules:

- A job that could not run even on an idle cluster (more ranks than every
  registered device it may use can hold, whatever their health, drain or load)
  is refused at submit in one line (:func:`check_fits`): it would wait for ever.
- Every other job is accepted as QUEUED, within the :class:`Limits` (jobs per
  credential, spec bytes; RESOURCE_EXHAUSTED beyond them), and placed by
  :func:`admit` as soon as it fits.
- :func:`admit` walks the queue in order: priority, higher first, then
  submission (FIFO). A job that fits is placed at once. A job that does not fit
  **holds** every device it may use for the rest of the pass: a later job may
  still start on devices the earlier one cannot use (another node, another
  kind), but never on the ones it waits for, so a large job is not starved by a
  stream of small ones behind it. (Slurm's backfill would also let a short job
  use held devices when it ends before they are needed; jobs here declare no
  run time, so nothing can be backfilled safely.)
- A restart (a running job that lost a node or a rank) that finds no free device
  waits RESTARTING ahead of every queued job: the devices it may use are held for
  it (``held``) until the sweeper places it. It was admitted and running already;
  a failure it did not choose must not hand its place to jobs submitted since.
- The pass stops once no device has room left outside the held ones: with ten
  thousand queued jobs it still reads only the few at the head of the queue
  (each spec once: the store caches them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from hetero.coordinator.placement import DeviceSlot, Placement, PlacementError, place, suitable
from hetero.core.errors import ConfigError, HeteroError
from hetero.core.jobspec import MAX_SPEC_BYTES, JobSpec

#: Where placement's devices are keyed: (node id, device index).
DeviceKey = tuple[str, int]


class AdmissionError(HeteroError):
    """A submission beyond one of the coordinator's limits."""

    grpc_code = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class Limits:
    """What the coordinator admits (``coordinator.yaml``; docs/deploy.md#queue-and-limits).

    ``jobs_per_user``: queued and active jobs of one caller at once (a user's own
    credential or certificate is one user; each shared token is one: see
    ``hetero.coordinator.identity``);
    ``ranks_per_cpu_device``: ranks of active jobs on one CPU device (they share its
    cores; a CUDA device runs one); ``max_spec_bytes``: bytes of one job.yaml;
    ``concurrent_rpcs``: calls the server works on at once (gRPC's
    ``maximum_concurrent_rpcs``: beyond it a call is refused RESOURCE_EXHAUSTED before
    its request is read); every agent's order stream holds one for as long as it runs,
    so it is several times the nodes a coordinator serves; ``max_message_bytes``: largest request of any caller.
    """

    jobs_per_user: int = 1000
    ranks_per_cpu_device: int = 8
    max_spec_bytes: int = 256 * 1024
    concurrent_rpcs: int = 8192
    max_message_bytes: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        for key in ("jobs_per_user", "ranks_per_cpu_device", "concurrent_rpcs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 1024 <= self.max_spec_bytes <= MAX_SPEC_BYTES:
            raise ConfigError(
                f"max_spec_bytes must be in [1024, {MAX_SPEC_BYTES}], got {self.max_spec_bytes}"
            )
        if not self.max_spec_bytes + 4096 <= self.max_message_bytes <= 64 * 1024 * 1024:
            raise ConfigError(
                f"max_message_bytes must be in [max_spec_bytes + 4096, 64 MiB], "
                f"got {self.max_message_bytes}"
            )


def check_spec_bytes(spec_yaml: str, limits: Limits) -> None:
    """RESOURCE_EXHAUSTED for a spec over ``max_spec_bytes`` (checked before parsing)."""
    size = len(spec_yaml.encode("utf-8", errors="replace"))
    if size > limits.max_spec_bytes:
        raise AdmissionError(
            f"job spec is {size:,} bytes, over the coordinator's limit of "
            f"{limits.max_spec_bytes:,} (max_spec_bytes)"
        )


def check_jobs_per_user(who: str, active: int, limits: Limits) -> None:
    """RESOURCE_EXHAUSTED once ``who`` has ``jobs_per_user`` queued or active jobs."""
    if active >= limits.jobs_per_user:
        raise AdmissionError(
            f"{who} has {active:,} queued or active jobs, the coordinator's limit "
            f"(jobs_per_user {limits.jobs_per_user:,}): cancel some or wait for them to finish"
        )


def idle(devices: Sequence[DeviceSlot]) -> list[DeviceSlot]:
    """``devices`` as an idle, healthy, undrained cluster would have them."""
    return [dataclasses.replace(d, healthy=True, draining=False, ranks_running=0) for d in devices]


def check_fits(spec: JobSpec, devices: Sequence[DeviceSlot]) -> None:
    """``PlacementError`` (one line) if ``spec`` could not run even on an idle cluster."""
    usable = [d for d in devices if suitable(spec, d)]
    capacity = sum(d.max_ranks or spec.world_size for d in usable)
    if capacity >= spec.world_size:
        return
    kinds = {"cuda": "CUDA devices", "cpu": "CPU devices"}.get(spec.resources.device, "devices")
    if spec.resources.device == "any" and not spec.resources.allow_cpu:
        kinds = "CUDA devices (allow_cpu is false)"
    nodes = f" of nodes {', '.join(spec.resources.nodes)}" if spec.resources.nodes else ""
    cpu = [d.max_ranks for d in usable if d.kind == "cpu" and d.max_ranks]
    per_cpu = f" at {max(cpu)} ranks each (ranks_per_cpu_device)" if cpu else ""
    raise PlacementError(
        f"job {spec.name!r} needs {spec.world_size} ranks, more than the {len(usable)} "
        f"registered {kinds}{nodes} can ever hold ({capacity}{per_cpu}): it would wait for ever"
    )


@dataclass(frozen=True)
class Waiting:
    """A queued job as :func:`admit` sees it; ``spec`` is read only if the pass gets to it."""

    job_id: str
    spec: Callable[[], JobSpec]


@dataclass(frozen=True)
class Decision:
    """What the pass decided for one queued job: its placement, or why it still waits."""

    job_id: str
    placement: Placement | None = None
    reason: str = ""


def key(d: DeviceSlot) -> DeviceKey:
    return d.key


def has_room(d: DeviceSlot) -> bool:
    return d.healthy and not d.draining and d.room != 0


def admit(
    queue: Iterable[Waiting],
    devices: Sequence[DeviceSlot],
    ports: Iterator[int],
    held: Iterable[DeviceKey] = (),
) -> list[Decision]:
    """One pass over ``queue`` (in queue order) on ``devices`` as they are now; ``ports``
    yields free rendezvous ports, one taken per job placed; ``held`` devices are kept for
    jobs ahead of the whole queue (restarts waiting for devices). Returns a decision for
    each job the pass looked at, in order; the jobs after the last one were not looked at
    (no device had room left outside those held for earlier jobs: the last decision
    says why its job waits, and the ones behind it keep the reason they had).

    A submission runs this pass on the event loop, so each job it looks at costs one
    walk over the devices its spec may use (a cluster of thousands of devices is
    walked a few times a pass, not once per check): a job that wants more ranks than
    that room holds waits without a placement being tried."""
    slots = {key(d): d for d in devices}
    kept: set[DeviceKey] = set(held)
    out: list[Decision] = []
    for waiting in queue:
        spec = waiting.spec()
        usable = [d for d in slots.values() if suitable(spec, d)]
        free = [d for d in usable if has_room(d) and key(d) not in kept]
        room = sum(spec.world_size if d.room is None else d.room for d in free)
        if room < spec.world_size:
            out.append(Decision(waiting.job_id, reason=reason(spec, usable, kept)))
            if not any(has_room(d) and key(d) not in kept for d in slots.values()):
                break  # nothing can start: read no further
            kept.update(key(d) for d in usable)
            continue
        try:
            placement = place(spec, free, 0)
        except PlacementError:  # room enough, but not where the spec may run (memory)
            out.append(Decision(waiting.job_id, reason=reason(spec, usable, kept)))
            kept.update(key(d) for d in usable)
            continue
        port = next(ports, None)
        if port is None:
            out.append(Decision(waiting.job_id, reason="waiting for a free rendezvous port"))
            break
        out.append(Decision(waiting.job_id, dataclasses.replace(placement, master_port=port)))
        for r in placement.ranks:
            d = slots[key(r.device)]
            slots[key(d)] = dataclasses.replace(d, ranks_running=d.ranks_running + 1)
    return out


#: Node names a reason lists at most ("3,744 free on n1, n2, n3 and 933 more nodes").
REASON_NODES = 3


def reason(spec: JobSpec, devices: Sequence[DeviceSlot], held: set[DeviceKey]) -> str:
    """Why ``spec`` waits, in one line: "waiting for 2 CPU slots; 1 free on n1"."""
    what = {"cuda": "CUDA device", "cpu": "CPU slot"}.get(spec.resources.device, "device")
    plural = "s" if spec.world_size != 1 else ""
    want = f"waiting for {spec.world_size} {what}{plural}"
    free_on: dict[str, int] = {}
    kept = 0
    drained: set[str] = set()
    down: set[str] = set()
    for d in devices:
        if not suitable(spec, d):
            continue
        if not d.healthy:
            down.add(d.node_name)
        elif d.draining:
            drained.add(d.node_name)
        if not has_room(d):
            continue
        n = d.room if d.room is not None else spec.world_size
        if key(d) in held:
            kept += n
        else:
            free_on[d.node_name] = free_on.get(d.node_name, 0) + n
    free = sum(free_on.values())
    parts = [f"{free:,} free on {_names(free_on)}" if free else "none free"]
    if kept:
        parts.append(f"{kept:,} held for jobs ahead in the queue")
    if drained:
        parts.append(f"drained: {_names(drained)}")
    if down:
        parts.append(f"down: {_names(down)}")
    return f"{want}; {'; '.join(parts)}"


def _names(nodes: Iterable[str]) -> str:
    """The first :data:`REASON_NODES` node names, and how many more: a job's message
    stays one line on a cluster of a thousand nodes."""
    names = sorted(nodes)
    shown = ", ".join(names[:REASON_NODES])
    more = len(names) - REASON_NODES
    return f"{shown} and {more:,} more node{'s' if more != 1 else ''}" if more > 0 else shown
