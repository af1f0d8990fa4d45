"""What operators see of a running cluster, against a real coordinator fed by a simulated
one: Job.live, GetJobDetail paging, straggler events, drain, /metrics and export."""

from __future__ import annotations

import csv
import io
import json
import re
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.registry import CollectorRegistry

from hetero.coordinator import cli
from hetero.coordinator.config import load_config, with_flags
from hetero.coordinator.metricsserver import MetricsServer
from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2 as pb

DEADLINE_S = 5.0
SAMPLE = re.compile(r'^[a-z_:][a-z0-9_:]*\{([a-z_]+="(?:[^"\\]|\\.)*",?)*\} \S+$')


def test_live_throughput_puts_measured_between_equal_and_ideal(sim) -> None:  # type: ignore[no-untyped-def]
    from simcluster import populate

    job = populate(sim)
    live = job.live
    assert job.total_steps == 400 and live.end_step == 80 and live.emulated
    assert live.equal_samples_per_s < live.samples_per_s <= live.ideal_samples_per_s
    assert 0.1 < live.loss < 2.5
    assert [f.rank for f in live.stragglers] == [2], "the emulated-slow A100 is flagged"


def test_job_detail_pages_from_the_start_or_returns_the_newest(sim) -> None:  # type: ignore[no-untyped-def]
    from simcluster import populate

    job = populate(sim)
    newest = sim.stub.GetJobDetail(
        pb.GetJobDetailRequest(job_id=job.id, max_intervals=3), timeout=DEADLINE_S
    )
    assert [iv.end_step for iv in newest.intervals] == [60, 70, 80] and not newest.more
    assert newest.intervals[0].HasField("received_at_unix_s")
    assert [p.version for p in newest.plans] == list(range(1, job.plan.version + 1))
    steps, after = [], -1
    while True:
        page = sim.stub.GetJobDetail(
            pb.GetJobDetailRequest(job_id=job.id, max_intervals=3, after_step=after),
            timeout=DEADLINE_S,
        )
        steps += [iv.end_step for iv in page.intervals]
        if not page.more:
            break
        after = page.intervals[-1].end_step
    assert steps == list(range(10, 90, 10))
    kinds = [e.kind for e in newest.job.events]
    assert kinds.count("straggler") == 1, "one event per straggler episode, not per interval"


def test_a_drained_node_gets_no_new_ranks_until_undrained(sim, coordinator) -> None:  # type: ignore[no-untyped-def]
    from simcluster import SMALL_JOB_SPEC

    sim.register()
    sim.heartbeat()
    node = sim.stub.DrainNode(pb.DrainNodeRequest(node="cpu-c"), timeout=DEADLINE_S)
    assert node.draining and node.name == "cpu-c"
    # The job waits for the drained node (drains end) instead of being refused.
    queued = sim.submit(SMALL_JOB_SPEC)
    assert queued.state == pb.JOB_STATE_QUEUED and not queued.ranks
    assert "drained: cpu-c" in queued.message, queued.message
    nodes = sim.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
    assert {n.name: n.draining for n in nodes} == {"cpu-c": True, "gpu-a": False, "gpu-b": False}
    assert cli.main(["drain", "cpu-c", "--undo", "--coordinator", coordinator.address]) == 0
    coordinator.flush()  # the queue's pass the undrain asked for
    placed = sim.stub.GetJob(pb.GetJobRequest(job_id=queued.id), timeout=DEADLINE_S)
    assert placed.state == pb.JOB_STATE_PENDING and placed.message == ""
    assert placed.ranks[0].node_name == "cpu-c"
    with pytest.raises(grpc.RpcError) as info:
        sim.stub.DrainNode(pb.DrainNodeRequest(node="nope"), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_metrics_listen_comes_from_the_config_file_or_the_flag(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "coordinator.yaml"
    path.write_text("metrics_listen: 127.0.0.1:9464\n")
    assert load_config(path).metrics_listen == "127.0.0.1:9464"
    flagged = with_flags(load_config(path), metrics_listen="0.0.0.0:9100")
    assert flagged.metrics_listen == "0.0.0.0:9100"
    with pytest.raises(ConfigError, match="host:port"):
        MetricsServer("9464", CollectorRegistry())


def test_metrics_endpoint_exports_job_counters_batches_stragglers_and_counts(sim, metrics) -> None:  # type: ignore[no-untyped-def]
    from simcluster import populate

    job = populate(sim)
    with urllib.request.urlopen(f"{metrics}/metrics", timeout=DEADLINE_S) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all(SAMPLE.match(line) for line in samples), "every sample line is well-formed"
    assert "hetero_device_" not in text, "device telemetry is each agent's to serve"
    assert 'hetero_nodes{state="up"} 3' in text and 'hetero_nodes{state="down"} 0' in text
    assert f'hetero_job_steps_total{{job="{job.id}"}} 80.0' in text
    assert f'hetero_job_samples_total{{job="{job.id}"}} {80.0 * 96}' in text
    assert "# TYPE hetero_job_samples_total counter" in text
    assert f'hetero_job_state{{job="{job.id}",state="running"}} 1' in text
    assert f'hetero_job_samples_per_second{{job="{job.id}"}}' in text
    assert f'hetero_job_equal_estimate_samples_per_second{{job="{job.id}"}}' in text
    batches = {
        int(m.group(1)): int(m.group(2))
        for m in re.finditer(
            rf'hetero_rank_batch_samples{{device="\d+",job="{job.id}",node="[^"]*",rank="(\d)"}} (\d+)',
            text,
        )
    }
    assert batches == dict(enumerate(job.plan.batches)) and sum(batches.values()) == 96
    assert re.search(
        rf'hetero_rank_straggler{{device="0",job="{job.id}",node="gpu-b",rank="2"}} 1', text
    )
    assert re.search(
        rf'hetero_rank_straggler{{[^}}]*job="{job.id}",node="[^"]*",rank="0"}} 0', text
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{metrics}/other", timeout=DEADLINE_S)
    assert info.value.code == 404


def test_export_writes_intervals_and_plans_as_csv_and_json(
    sim, coordinator, tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    from simcluster import populate

    job = populate(sim)
    out = tmp_path / "stats.csv"
    base = ["export", job.id, "--coordinator", coordinator.address]
    assert cli.main([*base, "--out", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 8 * 3 and rows[0]["end_step"] == "10" and rows[-1]["rank"] == "2"
    assert float(rows[0]["forward_s"]) > 0 and rows[0]["compute_s_per_sample"]
    assert cli.main([*base, "--table", "plans"]) == 0
    plans = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert plans[0]["version"] == "1" and len(plans[-1]["batches"].split()) == 3
    assert cli.main([*base, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["job"]["emulated"] and len(doc["intervals"]) == 24 and doc["plans"]
    assert doc["job"]["state"] == "RUNNING", "named as --json names it"
    assert cli.main(["export", "nope", "--coordinator", coordinator.address]) == 1
    assert "unknown job 'nope'" in capsys.readouterr().err
