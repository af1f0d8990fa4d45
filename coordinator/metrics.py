"""What the coordinator's ``/metrics`` exports, in one ``prometheus-client`` registry
(served by ``metricsserver``):

- ``hetero_rpc_duration_seconds``: the library's ``Histogram`` by ``method`` and
  ``code`` (the gRPC status's name), observed by every unary call's handler
  (``calls.rpc``) from its start to its reply or abort: what happens before the
  handler (decoding, the token check, a busy loop's queue) and after (encoding,
  sending) is the client's share of its own latency;
- ``hetero_job_samples_total`` and ``hetero_job_steps_total``: the library's
  ``Counter`` by ``job``, counted as interval reports are accepted (``rate()`` of them
  is the job's throughput), removed once the job has ended;
- the cluster from memory, as gauges: nodes (up, draining, host and device telemetry),
  placed jobs (state, plan, live figures) and their ranks (``families``). The state
  is the event loop's, so a scrape never reads it: it reads the newest cluster
  snapshot, which the loop builds at most once per ``snapshots.TTL_S`` whatever the
  scrape rate (``snapshots.Snapshots``). A scrape filtered by name (``?name[]=``, the
  library's) gets the histogram and counters only, without the snapshot.

Conventions: base units (seconds, bytes, watts, hertz, ratios 0-1), ``_total`` for
counters, ``_info`` gauges of 1 carrying descriptive labels; ``node`` is the node
name, ``device`` the device index on its node, ``job`` the job id, ``rank`` the rank.
A value a device cannot report is left out, not zero.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hetero.coordinator.snapshots import Snapshots
from hetero.core.states import job_label
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

RPC_SECONDS = "hetero_rpc_duration_seconds"
#: Upper bounds, seconds: fine enough to read a p99 anywhere between 1 ms and a few
#: seconds (neighbours at most 2x apart), and to tell answers from memory from the rest.
BUCKETS_S = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02),
    *(0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0),
)
_ENDED = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)

Labels = tuple[tuple[str, str], ...]


class CoordinatorMetrics:
    """One coordinator's registry: the RPC histogram and the jobs' counters, written on
    the event loop; the cluster's gauges, read from a snapshot at each scrape (``attach``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpc = Histogram(
            RPC_SECONDS,
            "Seconds the coordinator took to answer a call, from its handler's start to its "
            "reply or abort.",
            ("method", "code"),
            buckets=BUCKETS_S,
            registry=self.registry,
        )
        self.samples = Counter(
            "hetero_job_samples", "Samples trained, as reported.", ("job",), registry=self.registry
        )
        self.steps = Counter(
            "hetero_job_steps", "Steps trained, as reported.", ("job",), registry=self.registry
        )
        self._lock = threading.Lock()
        self._counted: set[str] = set()

    def observe(self, method: str, code: str, seconds: float) -> None:
        """Count one call of ``method`` that ended with status ``code`` after ``seconds``."""
        self.rpc.labels(method, code).observe(seconds)

    def interval(self, report: tpb.IntervalReport) -> None:
        """Count an accepted interval report's samples and steps for its job."""
        with self._lock:
            self._counted.add(report.job_id)
        self.samples.labels(report.job_id).inc(sum(r.batch * r.steps for r in report.ranks))
        self.steps.labels(report.job_id).inc(max((r.steps for r in report.ranks), default=0))

    def keep_only(self, jobs: Iterable[str]) -> None:
        """Remove the counters of every job not in ``jobs`` (those that ended)."""
        live = set(jobs)
        with self._lock:
            gone, self._counted = self._counted - live, self._counted & live
        for job in gone:
            for counter in (self.samples, self.steps):
                with contextlib.suppress(KeyError):  # not counted yet: nothing to remove
                    counter.remove(job)

    def attach(self, snapshots: Snapshots) -> None:
        """Export the cluster of ``snapshots`` at each whole scrape (once per registry)."""
        self.registry.register(_Cluster(self, snapshots))


class _Cluster(Collector):  # type: ignore[misc, unused-ignore]
    """The cluster's gauges of the newest snapshot; the counters of jobs that ended go."""

    def __init__(self, metrics: CoordinatorMetrics, snapshots: Snapshots) -> None:
        self._metrics = metrics
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshots.message()
        self._metrics.keep_only(j.id for j in snapshot.jobs if j.state not in _ENDED)
        return iter(families(snapshot))


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


class Exposition:
    """Collects families; families without samples are left out."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}

    def add(self, name: str, kind: str, help_text: str, labels: Labels, value: float) -> None:
        family = self._families.setdefault(name, Family(name, kind, help_text))
        family.samples.append((labels, value))

    def collect(self) -> Iterator[Metric]:
        return (f.metric() for f in self._families.values())


def families(snapshot: pb.ClusterSnapshot) -> list[Metric]:
    """The metric families of ``snapshot``."""
    out = Exposition()
    node_names = {n.id: n.name for n in snapshot.nodes}
    counts = {"up": 0, "down": 0, "draining": 0}
    for node in snapshot.nodes:
        counts["up" if node.healthy else "down"] += 1
        counts["draining"] += node.draining
        _node(out, node)
    for state, n in counts.items():
        out.add("hetero_nodes", "gauge", "Nodes up, down, and draining.", (("state", state),), n)
    for job in snapshot.jobs:
        _job(out, job, node_names)
    return list(out.collect())


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
