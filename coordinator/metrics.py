"""What the coordinator's ``/metrics`` says, written by stock ``prometheus-client``: one
``CollectorRegistry`` per coordinator (tests run many in one process) holding the RPC
latency histogram and a collector of the cluster state in memory.

- ``hetero_rpc_duration_seconds{method, code}``: a library ``Histogram``. A unary call
  of the Coordinator service is timed from its handler's start to its return or abort
  (``calls``): the checks of who calls and the work on the loop, not the decoding,
  queueing and encoding around it (the client's share of its own figure). ``code`` is
  the gRPC status code's name, so a fast refusal does not pull an ``OK`` p99 down. A
  call refused before its handler runs (a bad token, ``concurrent_rpcs``) is not
  counted. ``hetero-bench load`` reads it with ``?name[]=NAME_bucket``.
- Job-level series of the jobs on devices (placed: starting, running, restarting):
  ``hetero_job_steps_total`` and ``hetero_job_samples_total`` are counters, what
  ``rate()`` wants (the steps of the current attempt and ``steps x global batch``: the
  global batch is fixed, so they are exact; a resume from an older checkpoint goes back,
  which ``rate()`` reads as a counter reset). Beside them the job's step, state, plan
  and each rank's batch, and the newest interval's throughput and stragglers. A job's
  series end with it: a finished job is not placed, so its series are gone at the next
  collection.
- Counts: ``hetero_jobs{state}`` (queued, running, ...: never a series per queued job,
  10,000 may wait) and ``hetero_nodes{state}`` (up, down, draining; a draining node
  counts as draining alone).

Device and host telemetry is not here: each agent serves its own devices' series
(``hetero-agent --metrics-listen``, ``agent.metrics``), which Prometheus scrapes from
the node itself. Written here it cost 0.3 s of the coordinator's interpreter for 1,000
nodes each time, which stalled the heartbeats until a process of its own wrote it.

Conventions: base units (seconds, samples), ``_total`` for counters, ``_info`` gauges of
1 carrying descriptive labels; ``job`` is the job id, ``rank`` the rank, ``node`` the
node's name, ``device`` the device index on its node. The registry is collected on the
coordinator's event loop (``metricsserver``), which owns the state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from hetero.coordinator import lifecycle, messages
from hetero.coordinator.state import ClusterState
from hetero.core.states import job_label
from hetero.core.textsafe import printable
from hetero.v1 import coordinator_pb2 as pb

NAME = "hetero_rpc_duration_seconds"
HELP = (
    "Seconds the coordinator took to answer a call, from its handler's start to its reply or abort."
)
#: Upper bounds, seconds: fine enough to read a p99 anywhere between 1 ms and a few
#: seconds (neighbours at most 2x apart; about 1.5x between 5 ms and 1 s), and to
#: tell the answers from memory (0.1 to 0.5 ms) from the rest.
BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
    10.0,
)


class RpcLatency:
    """The coordinator's latency histogram, in ``registry``. ``observe`` costs a few µs
    (the library's label lookup and its lock)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            NAME, HELP, ("method", "code"), buckets=BUCKETS_S, registry=registry
        )

    def observe(self, method: str, code: str, seconds: float) -> None:
        """Count one call of ``method`` that ended with status ``code`` after ``seconds``."""
        self.histogram.labels(method, code).observe(seconds)


class ClusterCollector(Collector):
    """The state's job series and counts, as the module says; ``state()`` gives the
    service's state (read on the loop that owns it), ``now()`` the Unix time and
    ``timeout_s`` how late a heartbeat makes a node down."""

    def __init__(
        self, state: Callable[[], ClusterState], now: Callable[[], float], timeout_s: float
    ) -> None:
        self._state = state
        self._now = now
        self._timeout_s = timeout_s

    def describe(self) -> Iterator[Metric]:
        """The families ``collect`` may give, without samples: the registry learns their
        names, so ``?name[]=`` of other families does not collect the cluster."""
        for name in _GAUGES:
            yield GaugeMetricFamily(name, "")
        for name in _COUNTERS:
            yield CounterMetricFamily(name, "")

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        yield _nodes(state, self._now(), self._timeout_s)
        jobs = Counter(j.state for j in state.unqueued() if not j.finished)
        if state.queued_count():
            jobs[lifecycle.QUEUED] = state.queued_count()
        counted = GaugeMetricFamily("hetero_jobs", "Jobs not finished, by state.", labels=["state"])
        for name in sorted(jobs):
            counted.add_metric([name.lower()], jobs[name])
        yield counted
        out = _Families()
        for job in state.placed_jobs():
            _job(out, messages.job_message(state, job))
        yield from out.families.values()


_COUNTERS = ("hetero_job_steps", "hetero_job_samples", "hetero_job_restarts")
_GAUGES = (
    "hetero_nodes",
    "hetero_jobs",
    "hetero_job_info",
    "hetero_job_state",
    "hetero_job_global_batch_samples",
    "hetero_job_world_size",
    "hetero_job_step",
    "hetero_job_plan_version",
    "hetero_job_emulated",
    "hetero_job_samples_per_second",
    "hetero_job_equal_estimate_samples_per_second",
    "hetero_job_ideal_samples_per_second",
    "hetero_job_loss",
    "hetero_rank_batch_samples",
    "hetero_rank_compute_seconds",
    "hetero_rank_step_seconds",
    "hetero_rank_compute_seconds_per_sample",
    "hetero_rank_straggler",
)


def _nodes(state: ClusterState, now: float, timeout_s: float) -> Metric:
    counts = {"up": 0, "down": 0, "draining": 0}
    for node in state.nodes.values():
        if node.draining:
            counts["draining"] += 1
        else:
            counts["up" if node.healthy(now, timeout_s) else "down"] += 1
    family = GaugeMetricFamily(
        "hetero_nodes",
        "Registered nodes: up (heartbeats on time), down (late), draining (no new ranks).",
        labels=["state"],
    )
    for name, n in counts.items():
        family.add_metric([name], n)
    return family


class _Families:
    """Families by name, their samples in the order added (each family's samples have
    the same label names, in the same order)."""

    def __init__(self) -> None:
        self.families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(
        self, name: str, help_text: str, labels: dict[str, str], value: float, counter: bool = False
    ) -> None:
        family = self.families.get(name)
        if family is None:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = self.families[name] = kind(name, help_text, labels=list(labels))
        # Names come from nodes and users: the API refuses control characters in them,
        # and what an older coordinator stored is escaped here, never exported raw.
        family.add_metric([printable(v) for v in labels.values()], float(value))


def _job(out: _Families, job: pb.Job) -> None:
    j = {"job": job.id}
    info = {**j, "name": job.name, "policy": job.policy, "backend": job.backend}
    out.add("hetero_job_info", "A job; name, policy and backend as labels.", info, 1)
    out.add(
        "hetero_job_state",
        "1 for the job's current state.",
        {**j, "state": job_label(job.state)},
        1,
    )
    out.add("hetero_job_global_batch_samples", "Global batch, samples.", j, job.global_batch)
    out.add("hetero_job_world_size", "Number of ranks.", j, job.world_size)
    out.add("hetero_job_step", "Highest global step reported.", j, job.last_step)
    out.add("hetero_job_steps", "Steps of the current attempt.", j, job.last_step, counter=True)
    out.add(
        "hetero_job_samples",
        "Samples trained in the current attempt (steps x global batch).",
        j,
        job.last_step * job.global_batch,
        counter=True,
    )
    out.add("hetero_job_restarts", "Restarts of the job.", j, job.restarts, counter=True)
    if job.HasField("plan"):
        out.add("hetero_job_plan_version", "Version of the job's plan.", j, job.plan.version)
    live = job.live if job.HasField("live") else None
    if live is not None:
        out.add(
            "hetero_job_emulated",
            "1 if a rank runs with an emulated slowdown (the numbers come from emulation).",
            j,
            live.emulated,
        )
        for field_name, metric, help_text in _LIVE:
            if live.HasField(field_name):
                out.add(metric, help_text, j, getattr(live, field_name))
    _ranks(out, job, live)


_LIVE = (
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
)


def _ranks(out: _Families, job: pb.Job, live: pb.JobLive | None) -> None:
    stats = {r.rank: r for r in live.ranks} if live is not None else {}
    flagged = {f.rank for f in live.stragglers} if live is not None else set()
    for r in job.ranks:
        labels = {
            "job": job.id,
            "rank": str(r.rank),
            "node": r.node_name or r.node_id,
            "device": str(r.device_index),
        }
        if r.rank < len(job.plan.batches):
            help_text = "The rank's batch in the job's current plan, samples."
            out.add("hetero_rank_batch_samples", help_text, labels, job.plan.batches[r.rank])
        s = stats.get(r.rank)
        if s is not None and s.steps > 0:
            help_text = "Mean compute-only seconds per step over the newest interval."
            out.add("hetero_rank_compute_seconds", help_text, labels, s.compute_s)
            help_text = "Mean wall seconds per step over the newest interval."
            out.add("hetero_rank_step_seconds", help_text, labels, s.step_s)
            if s.batch > 0:
                help_text = "Compute-only seconds per sample over the newest interval."
                out.add(
                    "hetero_rank_compute_seconds_per_sample",
                    help_text,
                    labels,
                    s.compute_s / s.batch,
                )
        if live is not None:
            help_text = "1 if the rank is flagged as a straggler."
            out.add("hetero_rank_straggler", help_text, labels, r.rank in flagged)
