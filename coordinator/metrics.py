"""Prometheus ``/metrics`` for the coordinator: device telemetry, job throughput,
per-rank batch sizes and straggler flags, in the text exposition format (0.0.4).

``render`` is pure (a ``ClusterSnapshot`` in, text out): it names the families
and samples (``families``), and ``prometheus-client`` writes them (``write``:
escaping, number format, ``_total`` for counters), so the exposition is the one
every exporter speaks. The HTTP side (a bounded server, a cached snapshot, the
listen rule, the RPC latency histogram of ``rpclatency`` beside it) is
``metricsserver``.

Conventions: base units (seconds, bytes, watts, hertz, ratios 0–1), ``_total``
for counters, ``_info`` gauges of 1 carrying descriptive labels; ``node`` is
the node name, ``device`` the device index on its node, ``job`` the job id,
``rank`` the rank. A value a device cannot report is left out, not zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from hetero.core.states import job_label
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric family: its samples in the order added (every sample has the same
    label names, in the same order)."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def metric(self) -> Metric:
        names = [k for k, _ in self.samples[0][0]] if self.samples else []
        made: GaugeMetricFamily | CounterMetricFamily
        if self.kind == "counter":
            made = CounterMetricFamily(self.name, self.help, labels=names)
        else:
            made = GaugeMetricFamily(self.name, self.help, labels=names)
        for labels, value in self.samples:
            made.add_metric([v for _, v in labels], float(value))
        return made


class Exposition(Collector):  # type: ignore[misc, unused-ignore]
    """Collects families, then writes them; families without samples are left out."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}

    def add(self, name: str, kind: str, help_text: str, labels: Labels, value: float) -> None:
        family = self._families.setdefault(name, Family(name, kind, help_text))
        family.samples.append((labels, value))

    def collect(self) -> Iterator[Metric]:
        return (f.metric() for f in self._families.values())

    def text(self) -> str:
        return write(self.collect()).decode("utf-8")


class _Written(Collector):  # type: ignore[misc, unused-ignore]
    """Families already collected, for ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def write(families: Iterable[Metric], names: frozenset[str] | None = None) -> bytes:
    """The exposition text of ``families``; with ``names``, of only the samples so named
    (``?name[]=`` as prometheus-client's own handler reads it: a histogram's are
    ``NAME_bucket``, ``NAME_count``, ...). A family left without samples is left out."""
    kept = []
    for family in families:
        if names is None:
            if family.samples:
                kept.append(family)
            continue
        samples = [s for s in family.samples if s.name in names]
        if samples:
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = samples
            kept.append(copy)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Written(kept))
    text: bytes = generate_latest(registry)
    return text


def families(snapshot: pb.ClusterSnapshot) -> list[Metric]:
    """The metric families of ``snapshot``."""
    out = Exposition()
    node_names = {n.id: n.name for n in snapshot.nodes}
    for node in snapshot.nodes:
        _node(out, node)
    for job in snapshot.jobs:
        _job(out, job, node_names)
    return list(out.collect())


def render(snapshot: pb.ClusterSnapshot) -> str:
    """The exposition text of ``snapshot``."""
    return write(families(snapshot)).decode("utf-8")


def _node(out: Exposition, node: pb.Node) -> None:
    n: Labels = (("node", node.name),)
    out.add("hetero_node_up", "gauge", "1 if the node's heartbeats are on time.", n, node.healthy)
    out.add(
        "hetero_node_draining",
        "gauge",
        "1 if drained: the node gets no new ranks.",
        n,
        node.draining,
    )
    out.add(
        "hetero_node_last_heartbeat_timestamp_seconds",
        "gauge",
        "Unix time of the node's last heartbeat.",
        n,
        node.last_heartbeat_unix_s,
    )
    host = node.host
    if host.HasField("cpu_percent"):
        help_text = "Host CPU utilization, 0-1."
        out.add("hetero_host_cpu_utilization_ratio", "gauge", help_text, n, host.cpu_percent / 100)
    if host.HasField("ram_used_bytes"):
        out.add(
            "hetero_host_memory_used_bytes", "gauge", "Host RAM in use.", n, host.ram_used_bytes
        )
    if host.HasField("ram_total_bytes"):
        out.add("hetero_host_memory_total_bytes", "gauge", "Host RAM.", n, host.ram_total_bytes)
    telemetry = {t.device_index: t for t in node.telemetry}
    for d in node.devices:
        labels: Labels = (("node", node.name), ("device", str(d.index)))
        kind = str(tpb.DeviceKind.Name(d.kind)).removeprefix("DEVICE_KIND_").lower()
        info = (*labels, ("name", d.name), ("kind", kind))
        out.add("hetero_device_info", "gauge", "A device; its name and kind as labels.", info, 1)
        out.add(
            "hetero_device_compute_score",
            "gauge",
            "Relative speed from the device's hardware profile (larger = faster).",
            labels,
            d.compute_score,
        )
        out.add(
            "hetero_device_emulated_slowdown",
            "gauge",
            "Emulated slowdown factor applied to the device (1 = none).",
            labels,
            d.emulated_slowdown or 1.0,
        )
        t = telemetry.get(d.index)
        if t is not None:
            _device_telemetry(out, labels, t)


_DEVICE_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("utilization_percent", "hetero_device_utilization_ratio", "Device utilization, 0-1.", 0.01),
    ("memory_used_bytes", "hetero_device_memory_used_bytes", "Device memory in use.", 1.0),
    ("memory_total_bytes", "hetero_device_memory_total_bytes", "Device memory.", 1.0),
    ("temperature_c", "hetero_device_temperature_celsius", "Device temperature.", 1.0),
    ("power_w", "hetero_device_power_watts", "Device power draw.", 1.0),
    ("sm_clock_mhz", "hetero_device_sm_clock_hertz", "Device SM clock.", 1e6),
)


def _device_telemetry(out: Exposition, labels: Labels, t: tpb.DeviceTelemetry) -> None:
    for field_name, metric, help_text, scale in _DEVICE_GAUGES:
        if t.HasField(field_name):
            out.add(metric, "gauge", help_text, labels, getattr(t, field_name) * scale)
    if t.HasField("throttle"):
        help_text = "1 if the device reports a clock-throttle reason."
        out.add("hetero_device_throttled", "gauge", help_text, labels, bool(t.throttle.reasons))


def _job(out: Exposition, job: pb.Job, node_names: dict[str, str]) -> None:
    j: Labels = (("job", job.id),)
    state = job_label(job.state)
    info = (*j, ("name", job.name), ("policy", job.policy), ("backend", job.backend))
    out.add("hetero_job_info", "gauge", "A job; name, policy and backend as labels.", info, 1)
    out.add(
        "hetero_job_state", "gauge", "1 for the job's current state.", (*j, ("state", state)), 1
    )
    out.add(
        "hetero_job_global_batch_samples", "gauge", "Global batch, samples.", j, job.global_batch
    )
    out.add("hetero_job_world_size", "gauge", "Number of ranks.", j, job.world_size)
    out.add("hetero_job_step", "gauge", "Highest global step reported.", j, job.last_step)
    out.add("hetero_job_restarts_total", "counter", "Restarts of the job.", j, job.restarts)
    if job.HasField("plan"):
        out.add(
            "hetero_job_plan_version", "gauge", "Version of the job's plan.", j, job.plan.version
        )
    live = job.live if job.HasField("live") else None
    if live is not None:
        out.add(
            "hetero_job_emulated",
            "gauge",
            "1 if a rank runs with an emulated slowdown (the numbers come from emulation).",
            j,
            live.emulated,
        )
        for field_name, metric, help_text in (
            ("samples_per_s", "hetero_job_samples_per_second", "Measured throughput."),
            (
                "equal_samples_per_s",
                "hetero_job_equal_estimate_samples_per_second",
                "Estimated throughput of equal batches (plain DDP) on the same ranks.",
            ),
            (
                "ideal_samples_per_s",
                "hetero_job_ideal_samples_per_second",
                "Sum of the ranks' standalone throughputs at their batches.",
            ),
            ("loss", "hetero_job_loss", "Mean training loss over the newest interval."),
        ):
            if live.HasField(field_name):
                out.add(metric, "gauge", help_text, j, getattr(live, field_name))
    _ranks(out, job, live, node_names)


def _ranks(
    out: Exposition, job: pb.Job, live: pb.JobLive | None, node_names: dict[str, str]
) -> None:
    stats = {r.rank: r for r in live.ranks} if live is not None else {}
    flagged = {f.rank for f in live.stragglers} if live is not None else set()
    for r in job.ranks:
        labels: Labels = (
            ("job", job.id),
            ("rank", str(r.rank)),
            ("node", r.node_name or node_names.get(r.node_id, r.node_id)),
            ("device", str(r.device_index)),
        )
        if r.rank < len(job.plan.batches):
            help_text = "The rank's batch in the job's current plan, samples."
            out.add(
                "hetero_rank_batch_samples", "gauge", help_text, labels, job.plan.batches[r.rank]
            )
        s = stats.get(r.rank)
        if s is not None and s.steps > 0:
            help_text = "Mean compute-only seconds per step over the newest interval."
            out.add("hetero_rank_compute_seconds", "gauge", help_text, labels, s.compute_s)
            help_text = "Mean wall seconds per step over the newest interval."
            out.add("hetero_rank_step_seconds", "gauge", help_text, labels, s.step_s)
            if s.batch > 0:
                out.add(
                    "hetero_rank_compute_seconds_per_sample",
                    "gauge",
                    "Compute-only seconds per sample over the newest interval.",
                    labels,
                    s.compute_s / s.batch,
                )
        if live is not None:
            help_text = "1 if the rank is flagged as a straggler."
            out.add("hetero_rank_straggler", "gauge", help_text, labels, r.rank in flagged)
