"""The agent's own Prometheus ``/metrics`` (``hetero-agent run --metrics-listen
HOST:PORT``, off by default): this node's host and device telemetry, from the
sampler's newest snapshot (``telemetry.TelemetrySampler.latest``), never waiting for
a sample.

Why here and not on the coordinator: the figures are sampled here, Prometheus can scrape
each node beside its node exporter, and the coordinator keeps to the job-level series
(writing the devices of 1,000 nodes took 0.3 s of its interpreter per scrape).

Served by ``prometheus_client.start_http_server``: a node has one scraper, or two, every
15 s, and no storm to bound; the library's server threads cost the agent nothing it
needs (the heartbeats and the trainers' ``AgentLocal`` calls run elsewhere, on gRPC's
own threads, and take the interpreter for microseconds). The library's server has no
authentication: the listen rule is AgentLocal's, loopback unless ``--insecure`` (the
figures carry no secret, but no listener of the project opens beyond loopback
without a word).

The series names are those the coordinator's ``/metrics`` had, so dashboards keep their
queries: ``node`` is this node's name, ``device`` its device index; base units (ratios
0-1, bytes, watts, hertz); a value a device cannot report is left out, not zero. A CPU
device's utilization and memory are the host's, as in the heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from hetero.agent.profile import NodeProfile
from hetero.agent.telemetry import Snapshot
from hetero.core.errors import ConfigError

#: Per GPU sample field: the series, its help, and the factor to its base unit.
_DEVICE_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("utilization_percent", "hetero_device_utilization_ratio", "Device utilization, 0-1.", 0.01),
    ("memory_used_bytes", "hetero_device_memory_used_bytes", "Device memory in use.", 1.0),
    ("memory_total_bytes", "hetero_device_memory_total_bytes", "Device memory.", 1.0),
    ("temperature_c", "hetero_device_temperature_celsius", "Device temperature.", 1.0),
    ("power_w", "hetero_device_power_watts", "Device power draw.", 1.0),
    ("sm_clock_mhz", "hetero_device_sm_clock_hertz", "Device SM clock.", 1e6),
)


class NodeCollector(Collector):
    """The series of node ``name``, whose devices ``profile`` lists, from ``latest()``."""

    def __init__(self, name: str, profile: NodeProfile, latest: Callable[[], Snapshot]) -> None:
        self._name = name
        self._profile = profile
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        snap = self._latest()
        node = self._name
        families: dict[str, GaugeMetricFamily] = {}

        def add(name: str, help_text: str, labels: dict[str, str], value: float) -> None:
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, help_text, labels=list(labels))
            family.add_metric(list(labels.values()), float(value))

        host = snap.host
        n = {"node": node}
        if host.cpu_percent is not None:
            add(
                "hetero_host_cpu_utilization_ratio",
                "Host CPU utilization, 0-1.",
                n,
                host.cpu_percent / 100,
            )
        if host.ram_used_bytes is not None:
            add("hetero_host_memory_used_bytes", "Host RAM in use.", n, host.ram_used_bytes)
        if host.ram_total_bytes is not None:
            add("hetero_host_memory_total_bytes", "Host RAM.", n, host.ram_total_bytes)
        gpus = {g.index: g for g in snap.gpus}
        for d in self._profile.devices:
            labels = {"node": node, "device": str(d.index)}
            info = {**labels, "name": d.name, "kind": d.kind}
            add("hetero_device_info", "A device; its name and kind as labels.", info, 1)
            add(
                "hetero_device_compute_score",
                "Relative speed from the device's hardware profile (larger = faster).",
                labels,
                d.compute_score,
            )
            add(
                "hetero_device_emulated_slowdown",
                "Emulated slowdown factor applied to the device (1 = none).",
                labels,
                self._profile.emulated_slowdown or 1.0,
            )
            g = gpus.get(d.index)
            if g is not None:
                for field, name, help_text, scale in _DEVICE_GAUGES:
                    value = getattr(g, field)
                    if value is not None:
                        add(name, help_text, labels, value * scale)
                if g.throttle_reasons is not None:
                    help_text = "1 if the device reports a clock-throttle reason."
                    add("hetero_device_throttled", help_text, labels, bool(g.throttle_reasons))
            elif d.kind == "cpu":
                cpu = (
                    (
                        "hetero_device_utilization_ratio",
                        "Device utilization, 0-1.",
                        host.cpu_percent,
                        0.01,
                    ),
                    (
                        "hetero_device_memory_used_bytes",
                        "Device memory in use.",
                        host.ram_used_bytes,
                        1.0,
                    ),
                    (
                        "hetero_device_memory_total_bytes",
                        "Device memory.",
                        host.ram_total_bytes,
                        1.0,
                    ),
                )
                for name, help_text, raw, scale in cpu:
                    if raw is not None:
                        add(name, help_text, labels, raw * scale)
        yield from families.values()


def serve_metrics(address: str, collector: Collector) -> WSGIServer:
    """Serve ``collector`` on ``address`` (``host:port``; port 0 = any free port) from the
    library's server threads (daemon threads: they end with the agent); the server
    (``server_address`` has the port; ``shutdown()`` stops it). A wrong address is a
    ``ConfigError`` in one line."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"metrics_listen must be host:port, got {address!r}")
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        server, _thread = start_http_server(int(port), host.strip("[]") or "0.0.0.0", registry)
    except OSError as exc:
        raise ConfigError(f"cannot listen for metrics on {address}: {exc.strerror}") from None
    return server
