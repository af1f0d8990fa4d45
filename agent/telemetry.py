"""Telemetry: a sampler thread that publishes an immutable snapshot every period.

Host figures come from psutil (CPU %, RAM), GPU figures from NVML through
:class:`~hetero.core.nvml.Nvml`; any field that cannot be read is ``None``
("n/a"). The heartbeat loop reads :meth:`TelemetrySampler.latest` and never
waits for a sample. Clocks are injectable so tests control time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from hetero.agent.sharing import ForeignLoad
from hetero.core.nvml import GpuSample, Nvml
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.agent.telemetry")


@dataclass(frozen=True)
class HostSample:
    cpu_percent: float | None = None
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """One sample of the node. ``time_unix_s`` comes from the injectable wall clock."""

    time_unix_s: float
    host: HostSample
    gpus: tuple[GpuSample, ...]
    #: Indexes of the node's CPU devices: their utilization and memory are the host's.
    cpu_indexes: tuple[int, ...] = ()

    def heartbeat(self, node_id: str) -> pb.HeartbeatRequest:
        req = pb.HeartbeatRequest(node_id=node_id)
        req.host.SetInParent()
        _set(req.host, "cpu_percent", self.host.cpu_percent)
        _set(req.host, "ram_used_bytes", self.host.ram_used_bytes)
        _set(req.host, "ram_total_bytes", self.host.ram_total_bytes)
        for g in self.gpus:
            d = req.devices.add(device_index=g.index)
            for field in (
                "utilization_percent",
                "memory_used_bytes",
                "memory_total_bytes",
                "temperature_c",
                "power_w",
                "sm_clock_mhz",
            ):
                _set(d, field, getattr(g, field))
            if g.throttle_reasons is not None:
                d.throttle.CopyFrom(tpb.ThrottleReasons(reasons=list(g.throttle_reasons)))
        for index in self.cpu_indexes:
            d = req.devices.add(device_index=index)
            _set(d, "utilization_percent", self.host.cpu_percent)
            _set(d, "memory_used_bytes", self.host.ram_used_bytes)
            _set(d, "memory_total_bytes", self.host.ram_total_bytes)
        return req


def _set(msg: object, field: str, value: float | int | None) -> None:
    if value is not None:
        setattr(msg, field, value)


def sample_host() -> HostSample:
    """CPU % since the previous call (the first call primes it and reads 0) and RAM."""
    try:
        cpu = float(psutil.cpu_percent(interval=None))
    except Exception:  # containers without /proc/stat access
        cpu = None
    try:
        vm = psutil.virtual_memory()
        return HostSample(cpu, int(vm.total - vm.available), int(vm.total))
    except Exception:
        return HostSample(cpu)


def own_pids(listed: tuple[int, ...], ranks: set[int]) -> set[int]:
    """Which of the ``listed`` pids are this agent's: itself, a rank, or a process in a
    rank's process group (a rank's own workers; the supervisor starts each rank as a
    group leader)."""
    ours = {os.getpid()} | ranks
    for pid in listed:
        try:
            if os.getpgid(pid) in ranks:
                ours.add(pid)
        except OSError:  # gone, or in another pid namespace
            pass
    return ours


class TelemetrySampler:
    """Samples host and GPUs every ``period_s`` seconds on a daemon thread."""

    def __init__(
        self,
        nvml: Nvml,
        gpu_indexes: Sequence[int],
        *,
        cpu_indexes: Sequence[int] = (),
        period_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        rank_pids: Callable[[], set[int]] = set,
        foreign: ForeignLoad | None = None,
    ) -> None:
        self.nvml = nvml
        #: The agent's rank processes: they, their process groups and the agent are ours.
        self.rank_pids = rank_pids
        #: Sustained use of each GPU by other processes (``agent.sharing``).
        self.foreign = foreign or ForeignLoad()
        self.gpu_indexes = tuple(gpu_indexes)
        self.cpu_indexes = tuple(cpu_indexes)
        self.period_s = period_s
        self.clock = clock
        self._stop = threading.Event()
        self._latest = self.sample()
        self._thread: threading.Thread | None = None

    def sample(self) -> Snapshot:
        gpus = tuple(self.nvml.sample(i) for i in self.gpu_indexes)
        now = self.clock()
        ranks = self.rank_pids()
        for g in gpus:
            ours = own_pids(g.pids or (), ranks)
            self.foreign.observe(g.index, now, g.utilization_percent, g.pids, ours)
        return Snapshot(now, sample_host(), gpus, self.cpu_indexes)

    def latest(self) -> Snapshot:
        return self._latest  # replaced whole, never mutated: safe to read from any thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._latest = self.sample()
            except Exception:  # a sampler bug must not take the agent down
                log.exception("telemetry sample failed; keeping the previous one")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
