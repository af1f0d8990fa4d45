"""Prometheus' own tooling on a real coordinator's ``/metrics`` and an agent's, and the
Grafana dashboard of ``deploy/grafana`` against the names those scrapes export.

The coordinator is real (gRPC on port 0, SQLite under ``tmp_path``), fed by the
simulated cluster: three nodes, a running job with eight intervals of rank
statistics and a pending one. The agent's is its collector over a node's sample
(``test_agent_metrics``), served by prometheus-client. ``promtool`` comes from
Debian's ``prometheus`` package; where it is absent the tests that need it skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent_metrics import PROFILE, SNAPSHOT

from hetero.agent.metrics import NodeCollector, serve_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "hetero.json"
DEADLINE_S = 5.0
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool absent (Debian: apt-get install prometheus)"
)

#: PromQL words that are not metric names: functions are followed by "(", these are not.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
PROMQL_WORDS |= {"and", "or", "unless", "bool", "offset", "inf", "nan"}
#: What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$job": ".*", "$__rate_interval": "1m", "$__interval": "15s"}


@pytest.fixture
def scrape(sim, metrics) -> str:  # type: ignore[no-untyped-def]
    """One scrape of a coordinator with nodes, a running job with intervals and a pending job."""
    from simcluster import populate

    populate(sim)
    with urllib.request.urlopen(f"{metrics}/metrics", timeout=DEADLINE_S) as resp:
        text: str = resp.read().decode()
    return text


@pytest.fixture
def agent_scrape() -> str:
    """One scrape of an agent's ``/metrics``: a GPU with telemetry and a CPU device."""
    server = serve_metrics("127.0.0.1:0", NodeCollector("gpu-a", PROFILE, lambda: SNAPSHOT))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=DEADLINE_S) as resp:
            text: str = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    return text


def sample_names(exposition: str) -> set[str]:
    """The names PromQL selects: each sample line's name (a counter's carries ``_total``)."""
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in exposition.splitlines()
        if line and not line.startswith("#")
    }


def dashboard_queries(dashboard: dict) -> Iterator[str]:  # type: ignore[type-arg]
    """Every PromQL expression of ``dashboard``: panel targets (rows included) and
    query variables' ``label_values(metric, label)`` metrics."""
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            found = re.fullmatch(r"label_values\((\w+), *\w+\)", query)
            assert found, (
                f"variable {variable['name']}: {query!r} is not label_values(metric, label)"
            )
            yield found.group(1)


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects. Label matchers, label lists, durations and
    strings are cut out first; what is left that is no function call or keyword is a
    metric name (``promtool check rules`` checks the syntax itself)."""
    cut = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    cut = re.sub(r"\{[^}]*\}", "", cut)
    cut = re.sub(r"\[[^\]]*\]", "", cut)
    cut = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", cut)
    names = set()
    for found in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(?!\w)(\s*\()?", cut):
        word = found.group(0).rstrip("( \t")
        if found.group(1) is None and word.lower() not in PROMQL_WORDS:
            names.add(word)
    return names


def substituted(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


@needs_promtool
def test_promtool_accepts_a_real_coordinators_and_agents_metrics(
    scrape: str, agent_scrape: str
) -> None:
    names = sample_names(scrape) | sample_names(agent_scrape)
    # What the scrapes must hold for the check to mean anything: nodes, devices, a job,
    # ranks measured over intervals, counters, the histogram of the calls that made them.
    for name in (
        "hetero_nodes",
        "hetero_device_utilization_ratio",
        "hetero_job_samples_per_second",
        "hetero_job_samples_total",
        "hetero_rank_compute_seconds_per_sample",
        "hetero_job_restarts_total",
        "hetero_rpc_duration_seconds_bucket",
    ):
        assert name in names, name
    assert PROMTOOL is not None
    for text in (scrape, agent_scrape):
        done = subprocess.run(
            [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
            done.stdout + done.stderr
        )


def test_metric_names_follow_prometheus_conventions(scrape: str, agent_scrape: str) -> None:
    """Base units in names, ``_total`` only on counters, no non-base units; a batch is
    counted in samples."""
    both = scrape + agent_scrape
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", both, re.MULTILINE))
    assert kinds, "the scrape has families"
    for name, kind in kinds.items():
        assert name.startswith("hetero_"), name
        assert name.endswith("_total") == (kind == "counter"), f"{name} is a {kind}"
        for unit in ("_ms", "_milliseconds", "_percent", "_mb", "_gb", "_mhz", "_kb", "batch_size"):
            assert unit not in name, (
                f"{name}: name the base unit (seconds, bytes, ratio, hertz, samples)"
            )


def test_the_grafana_dashboard_selects_only_exported_metrics(
    scrape: str, agent_scrape: str
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = sample_names(scrape) | sample_names(agent_scrape)
    queries = list(dashboard_queries(dashboard))
    used = set().union(*(metric_names(q) for q in queries))
    assert len(queries) >= 20 and len(used) >= 25, "the dashboard covers the exposition"
    missing = sorted(used - exported)
    assert not missing, f"the dashboard selects metrics no /metrics exports: {missing}"
    assert metric_names('sum by (job) (rate(x_total{job="a"}[5m])) / on(job) y') == {
        "x_total",
        "y",
    }, "the name extraction itself"


@needs_promtool
def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rules = [
        {"record": f"hetero:dashboard_query:{i}", "expr": substituted(q)}
        for i, q in enumerate(dashboard_queries(dashboard))
    ]
    path = tmp_path / "dashboard-rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
