"""The node's hardware profile: measured once, cached by hardware fingerprint.

Per device: matmul throughput (TFLOP/s), memory bandwidth and size, and for
CUDA the host<->device copy bandwidth. Per host: CPU matmul GFLOP/s and RAM.
The network to the coordinator is measured separately (it needs a channel):
see :func:`hetero.agent.network.measure_network`; so are the links to other
agents' nodes (they need a peer: :mod:`hetero.agent.peerprobe`, carried in
``peer_links``). The data directory's sequential read (:mod:`hetero.agent.diskprobe`)
is measured at every start, never cached: the directory, not the hardware, decides it.

``compute_score`` is the device's matmul TFLOP/s, so CPU and GPU scores share
one scale. An emulated slowdown is never folded into the measurement: it is
carried beside it (``emulated_slowdown``) and the coordinator divides. Two
things do lower it: a GPU's matmul figure that failed its plausibility check
(``agent.gpuprofile``), or one measured beside foreign processes, is replaced
by an idle same-model sibling's (else by the device's peak, or the shared
figure times 1 + the neighbour's utilization); and use of the GPU by foreign
processes, at the profile and sustained in telemetry, divides it
(``agent.sharing``), so initial plans give a shared GPU the smaller share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from hetero.agent.diskprobe import measure_disk_read
from hetero.agent.gpuprofile import CudaLayer, GpuProfile, TorchCuda, profile_gpu
from hetero.agent.peerprobe import PeerLink
from hetero.agent.sharing import sharing_factor
from hetero.core.nvml import Nvml
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.agent.profile")

#: Bump when the measurement changes, so old cache files are ignored.
#: 2: GPU figures timed on the measured device, checked against its limits.
PROFILE_VERSION = 2


@dataclass(frozen=True)
class DeviceMeasure:
    """One device. Bandwidths in bytes/s; ``None`` = not measured here."""

    index: int
    kind: str  # "cpu" or "cuda"
    name: str
    matmul_tflops: float
    memory_bandwidth_bytes_per_s: float | None = None
    host_to_device_bytes_per_s: float | None = None
    device_to_host_bytes_per_s: float | None = None
    memory_bytes: int | None = None
    #: Figures that exceeded the device's limits twice (field names); not scored.
    suspect: tuple[str, ...] = ()
    #: The idle device's TFLOP/s where ``matmul_tflops`` is not it (suspect, or measured
    #: beside foreign processes): a same-model idle sibling's figure, else an estimate.
    scored_tflops: float | None = None
    #: Other processes on the GPU while it was profiled (its figures are low).
    foreign_pids: tuple[int, ...] = ()
    #: Utilization by foreign processes, percent: at the profile, then sustained in
    #: telemetry (``agent.sharing``); ``None`` or 0 = not shared.
    foreign_utilization_percent: float | None = None

    @property
    def compute_score(self) -> float:
        """The idle device's matmul TFLOP/s times the sharing factor (``agent.sharing``)."""
        idle = self.matmul_tflops if self.scored_tflops is None else self.scored_tflops
        return max(idle * sharing_factor(self.foreign_utilization_percent), 1e-6)

    @property
    def shared_while_profiled(self) -> bool:
        return bool(self.foreign_pids)


@dataclass(frozen=True)
class NodeProfile:
    """What the agent registers with. ``emulated_slowdown`` > 1 marks a demo node."""

    cpu_model: str
    cpu_count: int
    cpu_gflops: float
    ram_bytes: int
    devices: tuple[DeviceMeasure, ...]
    measured_in_s: float = 0.0
    emulated_slowdown: float = 1.0
    network_rtt_s: float | None = None
    network_bytes_per_s: float | None = None
    #: Sequential read under the data directory, bytes/s, and how the page cache was
    #: avoided ("o_direct", "fadvise", "cached"; ``agent.diskprobe``). ``None``: not measured.
    disk_read_bytes_per_s: float | None = None
    disk_read_method: str = ""
    #: Links to other agents' nodes, as measured from here (``agent.peerprobe``).
    peer_links: tuple[PeerLink, ...] = ()
    fingerprint: str = field(default="", compare=False)

    @property
    def emulated(self) -> bool:
        return self.emulated_slowdown > 1.0

    def device_messages(self) -> list[tpb.DeviceProfile]:
        out = []
        for d in self.devices:
            msg = tpb.DeviceProfile(
                index=d.index,
                name=d.name,
                kind=tpb.DEVICE_KIND_CUDA if d.kind == "cuda" else tpb.DEVICE_KIND_CPU,
                matmul_tflops=d.matmul_tflops,
                compute_score=d.compute_score,
                emulated_slowdown=self.emulated_slowdown,
                suspect=list(d.suspect),
                shared_while_profiled=d.shared_while_profiled,
            )
            if d.foreign_utilization_percent:  # 0 = not shared: unset
                msg.foreign_utilization_percent = d.foreign_utilization_percent
            for name in (
                "memory_bandwidth_bytes_per_s",
                "host_to_device_bytes_per_s",
                "device_to_host_bytes_per_s",
                "memory_bytes",
            ):
                value = getattr(d, name)
                if value is not None:
                    setattr(msg, name, value)
            out.append(msg)
        return out

    def host_message(self) -> tpb.HostProfile:
        msg = tpb.HostProfile(
            cpu_model=self.cpu_model,
            cpu_count=self.cpu_count,
            cpu_gflops=self.cpu_gflops,
            ram_bytes=self.ram_bytes,
            emulated_slowdown=self.emulated_slowdown,
            measured_in_s=self.measured_in_s,
        )
        if self.network_rtt_s is not None:
            msg.network_rtt_s = self.network_rtt_s
        if self.network_bytes_per_s is not None:
            msg.network_bytes_per_s = self.network_bytes_per_s
        if self.disk_read_bytes_per_s is not None:
            msg.disk_read_bytes_per_s = self.disk_read_bytes_per_s
            msg.disk_read_method = self.disk_read_method
        msg.peer_links.extend(peer_link_message(link) for link in self.peer_links)
        return msg

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["emulated"] = self.emulated
        d["devices"] = [asdict(x) | {"compute_score": x.compute_score} for x in self.devices]
        return d


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(nvml: Nvml, quick: bool) -> str:
    """Stable for the same hardware and software: CPU, RAM, GPUs, torch version."""
    import torch

    gpus = [(nvml.device_name(i), nvml.memory_total_bytes(i)) for i in range(nvml.device_count())]
    parts = [
        PROFILE_VERSION,
        _cpu_model(),
        os.cpu_count(),
        psutil.virtual_memory().total,
        gpus,
        torch.__version__,
        quick,
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _best_s(fn: Any, repeats: int, sync: Any = None) -> float:
    """The fastest of ``repeats`` timed calls of ``fn``, in seconds (after one warm-up)."""
    fn()
    if sync:
        sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def measure_cpu(quick: bool) -> DeviceMeasure:
    import torch

    n = 512 if quick else 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    tflops = 2 * n**3 / _best_s(lambda: a @ b, 5) / 1e12
    # Larger than the last-level cache, or the "memory" bandwidth is the cache's.
    size = (32 if quick else 128) * 1024 * 1024
    src = torch.empty(size, dtype=torch.uint8)
    dst = torch.empty_like(src)
    # A copy reads and writes every byte.
    bandwidth = 2 * size / _best_s(lambda: dst.copy_(src), 3)
    return DeviceMeasure(
        index=0,
        kind="cpu",
        name=f"cpu ({os.cpu_count()} cores)",
        matmul_tflops=tflops,
        memory_bandwidth_bytes_per_s=bandwidth,
        memory_bytes=int(psutil.virtual_memory().total),
    )


def _device(p: GpuProfile) -> DeviceMeasure:
    f = p.figures
    idle: float | None = None
    if "matmul_tflops" in p.suspect:
        # The peak (or, unknown, the sanity bound): an upper bound, until a sibling says better.
        idle = p.limits.matmul_tflops or p.limits.bound("matmul_tflops")
    elif p.foreign_pids:
        # Measured beside a neighbour busy u of the time: about 1/(1 + u) of the idle speed.
        idle = f.matmul_tflops * (1 + (p.foreign_utilization_percent or 0.0) / 100)
    return DeviceMeasure(
        index=p.index,
        kind="cuda",
        name=p.props.name,
        matmul_tflops=f.matmul_tflops,
        memory_bandwidth_bytes_per_s=f.memory_bandwidth_bytes_per_s,
        host_to_device_bytes_per_s=f.host_to_device_bytes_per_s,
        device_to_host_bytes_per_s=f.device_to_host_bytes_per_s,
        memory_bytes=p.props.memory_bytes,
        suspect=p.suspect,
        scored_tflops=idle,
        foreign_pids=p.foreign_pids,
        foreign_utilization_percent=p.foreign_utilization_percent if p.foreign_pids else None,
    )


def score_from_idle_siblings(devices: list[DeviceMeasure]) -> list[DeviceMeasure]:
    """A GPU whose matmul figure is not its idle speed (suspect, or measured beside
    foreign processes) is scored as the median figure of the node's idle, plausible
    GPUs of the same model: alike devices run alike when idle."""
    out = []
    for d in devices:
        if d.scored_tflops is not None:
            alike = sorted(
                x.matmul_tflops
                for x in devices
                if x.name == d.name and x.scored_tflops is None and x.kind == d.kind
            )
            if alike:
                d = replace(d, scored_tflops=alike[len(alike) // 2])
        out.append(d)
    return out


def measure(nvml: Nvml, quick: bool, cuda: CudaLayer | None = None) -> NodeProfile:
    """Measure every device now. A few seconds on a CPU box with ``quick``."""
    cuda = cuda or TorchCuda()
    t0 = time.perf_counter()
    cpu = measure_cpu(quick)
    devices: list[DeviceMeasure] = []
    for i in range(cuda.device_count()):
        try:
            devices.append(_device(profile_gpu(nvml, cuda, i, quick)))
            cuda.release(i)
        except RuntimeError as exc:  # a busy or broken GPU: leave it out, keep going
            log.warning("cannot profile cuda:%d (%s); not offered", i, exc)
    if not devices:
        devices = [cpu]  # no GPU: the node offers its CPU
    return NodeProfile(
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count() or 1,
        cpu_gflops=cpu.matmul_tflops * 1e3,
        ram_bytes=int(psutil.virtual_memory().total),
        devices=tuple(score_from_idle_siblings(devices)),
        measured_in_s=time.perf_counter() - t0,
    )


def load_or_measure(
    state_dir: Path, nvml: Nvml, *, quick: bool, refresh: bool, data_dir: Path | None = None
) -> NodeProfile:
    """The cached profile for this hardware, else a fresh measurement (then cached),
    with the sequential read of ``data_dir`` (default ``state_dir``) measured now."""
    profile = _load_or_measure(state_dir, nvml, quick=quick, refresh=refresh)
    return with_disk_read(profile, data_dir or state_dir, QUICK_DISK_BYTES if quick else None)


#: The disk probe's file with ``quick``: the test clusters start many agents at once.
QUICK_DISK_BYTES = 4 * 1024 * 1024


def with_disk_read(profile: NodeProfile, data_dir: Path, size: int | None = None) -> NodeProfile:
    """``profile`` with the sequential read of ``data_dir``'s disk (a ``size``-byte
    file, default ``diskprobe.PROBE_BYTES``); unchanged (and a warning logged) where
    the directory cannot hold the probe's file."""
    read = measure_disk_read(data_dir) if size is None else measure_disk_read(data_dir, size)
    if read is None:
        log.warning("cannot measure the disk read of %s (not writable): no figure", data_dir)
        return profile
    return replace(profile, disk_read_bytes_per_s=read.bytes_per_s, disk_read_method=read.method)


def _load_or_measure(state_dir: Path, nvml: Nvml, *, quick: bool, refresh: bool) -> NodeProfile:
    fp = fingerprint(nvml, quick)
    path = state_dir / "profiles" / f"{fp}.json"
    if path.is_file() and not refresh:
        try:
            data = json.loads(path.read_text())
            devices = tuple(_cached_device(d) for d in data.pop("devices"))
            profile = NodeProfile(devices=devices, **data)
            if any(d.suspect or d.foreign_pids for d in devices):
                # Taken while shared or with suspect figures: worth another try.
                log.info("cached profile %s was suspect or shared: measuring again", path)
            else:
                log.info("hardware profile from cache %s", path)
                return replace(profile, measured_in_s=0.0, fingerprint=fp)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring unreadable profile cache %s (%s)", path, exc)
    profile = replace(measure(nvml, quick), fingerprint=fp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(profile)
        for key in _NOT_CACHED:
            data.pop(key)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot cache the profile in %s (%s)", path, exc.strerror)
    return profile


#: Figures of this run, not of the hardware: never written to the cache.
_NOT_CACHED = (
    "fingerprint",
    "emulated_slowdown",
    "network_rtt_s",
    "network_bytes_per_s",
    "disk_read_bytes_per_s",
    "disk_read_method",
    "peer_links",
)


def _cached_device(data: dict[str, Any]) -> DeviceMeasure:
    # JSON holds tuples as lists. (A profile taken while shared is never reused.)
    for key in ("suspect", "foreign_pids"):
        data[key] = tuple(data.get(key, ()))
    return DeviceMeasure(**data)


def peer_link_message(link: PeerLink) -> tpb.PeerLink:
    """A measured link as the protocol carries it (unset: a direction too fast to time)."""
    msg = tpb.PeerLink(peer=link.peer, rtt_s=link.rtt_s)
    if link.send_bytes_per_s is not None:
        msg.send_bytes_per_s = link.send_bytes_per_s
    if link.receive_bytes_per_s is not None:
        msg.receive_bytes_per_s = link.receive_bytes_per_s
    return msg
