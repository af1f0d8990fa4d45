"""Authentication over real gRPC: tokens, TLS, mutual TLS, the listen rule, message limits.

Real servers on port 0 with SQLite under tmp_path, real clients, real CLIs as
subprocesses; certificates come from a throwaway CA made with ``cryptography``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pki import Pki, make_pki

from hetero.agent.local import AgentLocalService, PlanCache, create_local_server
from hetero.coordinator.server import Settings, create_server
from hetero.core.errors import ConfigError
from hetero.security.auth import JobTokens, Secret
from hetero.security.transport import ClientSecurity, ServerSecurity, TLSFiles, client_channel
from hetero.v1 import agent_pb2_grpc, coordinator_pb2_grpc
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

TOKEN = "tok-7f3a9c1be5d24f6a8b0c1d2e3f405162"
DEADLINE_S = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# ---- servers ------------------------------------------------------------------------------


@dataclass
class Served:
    address: str
    db_path: Path


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    """``serve(security) -> Served``: a coordinator with that security on 127.0.0.1:0."""
    stops = []

    def start(security: ServerSecurity, roots: tuple[str, ...] | None = None) -> Served:
        db = tmp_path / f"coord{len(stops)}.db"
        deps = Settings(db_url=f"sqlite:///{db}", allowed_roots=roots)
        server, port = create_server("127.0.0.1:0", deps, security)
        server.start()
        stops.append(server)
        return Served(f"127.0.0.1:{port}", db)

    yield start
    for server in stops:
        server.stop(0).wait()


def _nodes(address: str, security: ClientSecurity | None = None) -> pb.ListNodesResponse:
    with client_channel(address, security) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        return stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S)


def _error(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_every_rpc_needs_the_token_but_health_checks_stay_open(serve) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity(token=Secret(TOKEN)))
    missing = _error(lambda: _nodes(s.address))
    assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
    assert missing.details() == (
        "unauthenticated: the coordinator requires a token (--token-file or $HETERO_TOKEN_FILE)"
    )
    wrong = _error(lambda: _nodes(s.address, ClientSecurity(Secret(TOKEN[:-1] + "0"))))
    assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED and "did not accept" in wrong.details()
    assert TOKEN[:-1] not in wrong.details()
    assert _nodes(s.address, ClientSecurity(Secret(TOKEN))).nodes == []
    with grpc.insecure_channel(s.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        resp = health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        # Streaming methods are refused too (reflection is a bidirectional stream).
        raw = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        )
        with pytest.raises(grpc.RpcError) as info:
            list(raw(iter([b""]), timeout=DEADLINE_S))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_rejected_call_writes_nothing(serve) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity(token=Secret(TOKEN)))
    with client_channel(s.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        request = pb.RegisterNodeRequest(
            name="intruder",
            address="10.6.6.6",
            devices=[tpb.DeviceProfile(index=0, kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)],
        )
        err = _error(lambda: stub.RegisterNode(request, timeout=DEADLINE_S))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _nodes(s.address, ClientSecurity(Secret(TOKEN))).nodes == []


def test_tls_with_a_token_and_what_a_client_without_the_ca_sees(serve, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity(Secret(TOKEN), TLSFiles(pki.server_cert, pki.server_key)))
    good = ClientSecurity(Secret(TOKEN), TLSFiles(ca=pki.ca))
    assert _nodes(s.address, good).nodes == []
    plaintext = _error(lambda: _nodes(s.address, ClientSecurity(Secret(TOKEN))))
    assert plaintext.code() == grpc.StatusCode.UNAVAILABLE
    impostor_ca = ClientSecurity(Secret(TOKEN), TLSFiles(ca=pki.other_ca))
    assert _error(lambda: _nodes(s.address, impostor_ca)).code() == grpc.StatusCode.UNAVAILABLE
    no_token = _error(lambda: _nodes(s.address, ClientSecurity(tls=TLSFiles(ca=pki.ca))))
    assert no_token.code() == grpc.StatusCode.UNAUTHENTICATED


def test_mutual_tls_requires_a_client_certificate_from_the_ca(serve, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity(tls=TLSFiles(pki.server_cert, pki.server_key, pki.ca)))
    with_cert = ClientSecurity(tls=TLSFiles(pki.client_cert, pki.client_key, pki.ca))
    assert _nodes(s.address, with_cert).nodes == []
    without = _error(lambda: _nodes(s.address, ClientSecurity(tls=TLSFiles(ca=pki.ca))))
    assert without.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_alone_may_listen_beyond_loopback(tmp_path: Path, pki: Pki) -> None:
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    mtls = ServerSecurity(tls=TLSFiles(pki.server_cert, pki.server_key, pki.ca))
    server, port = create_server("0.0.0.0:0", deps, mtls)
    server.start()
    try:
        sec = ClientSecurity(tls=TLSFiles(pki.client_cert, pki.client_key, pki.ca))
        assert _nodes(f"127.0.0.1:{port}", sec).nodes == []
    finally:
        server.stop(0).wait()


def test_agent_endpoint_takes_only_the_jobs_own_token(serve) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity(token=Secret(TOKEN)))
    tokens = JobTokens(Secret("agent-local-0123456789abcdef0123"))
    with client_channel(s.address, ClientSecurity(Secret(TOKEN))) as upstream:
        service = AgentLocalService(
            coordinator_pb2_grpc.CoordinatorStub(upstream),
            PlanCache(),
            forward_timeout_s=DEADLINE_S,  # the test's deadline: a loaded runner forwards slowly
            job_tokens=tokens,
        )
        server, port = create_local_server("127.0.0.1:0", service)
        server.start()
        try:
            request = tpb.GetPlanRequest(job_id="nope")

            def plan(token: Secret | None) -> tpb.Plan:
                with client_channel(f"127.0.0.1:{port}", ClientSecurity(token)) as channel:
                    stub = agent_pb2_grpc.AgentLocalStub(channel)
                    return stub.GetPlan(request, timeout=DEADLINE_S)

            missing = _error(lambda: plan(None))
            assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "$HETERO_AGENT_TOKEN" in missing.details()
            coordinator_token = _error(lambda: plan(Secret(TOKEN)))
            assert coordinator_token.code() == grpc.StatusCode.UNAUTHENTICATED
            other_job = _error(lambda: plan(tokens.for_job("other")))
            assert other_job.code() == grpc.StatusCode.UNAUTHENTICATED
            # With its job's token the call reaches the coordinator (with the agent's token).
            assert _error(lambda: plan(tokens.for_job("nope"))).code() == grpc.StatusCode.NOT_FOUND
        finally:
            server.stop(0).wait()


def test_an_oversized_request_and_a_spec_over_the_limit_are_resource_exhausted(serve) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity())
    with client_channel(s.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        huge = pb.SubmitJobRequest(spec_yaml="#" * (17 * 1024 * 1024))
        err = _error(lambda: stub.SubmitJob(huge, timeout=30))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        big = pb.SubmitJobRequest(spec_yaml="#" * (2 * 1024 * 1024))
        err = _error(lambda: stub.SubmitJob(big, timeout=30))
        # Under the message limit, over the spec limit: refused before parsing, naming the limit.
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "job spec is 2,097,152 bytes" in err.details()
        assert "max_spec_bytes" in err.details()


def test_submit_outside_the_allowed_roots_names_the_field_and_stores_nothing(serve) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity(), roots=("/srv/hetero",))
    spec = (
        "name: j\nmodel: debug\nglobal_batch: 8\nsteps: 10\nresources: {ranks: 1}\n"
        "checkpoint:\n  dir: /srv/hetero/../../etc/cron.d\n"
    )
    with client_channel(s.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        err = _error(
            lambda: stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S)
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith("job.yaml:7: checkpoint.dir: /etc/cron.d is outside")
        assert stub.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S).jobs == []


def test_values_outside_the_schema_are_invalid_argument_naming_the_field(serve) -> None:  # type: ignore[no-untyped-def]
    s = serve(ServerSecurity())
    with client_channel(s.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        cases = [
            (
                stub.ListJobs,
                pb.ListJobsRequest(limit=-1),
                "ListJobs: limit: must be in [0, 2147483647], got -1",
            ),
            (
                stub.ListJobs,
                pb.ListJobsRequest(states=[99]),
                "ListJobs: states[0]: unknown value 99",
            ),
            (
                stub.ReportRankStatus,
                pb.ReportRankStatusRequest(job_id="j", state=-3),
                "ReportRankStatus: state: unknown value -3",
            ),
            (
                stub.RegisterNode,
                pb.RegisterNodeRequest(
                    name="n",
                    address="a",
                    devices=[tpb.DeviceProfile(compute_score=1, emulated_slowdown=float("nan"))],
                ),
                "RegisterNode: devices[0].emulated_slowdown: must be a finite number, got nan",
            ),
        ]
        for method, request, message in cases:
            err = _error(lambda m=method, r=request: m(r, timeout=DEADLINE_S))  # type: ignore[misc]
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details() == message


# ---- the daemons and CLIs as a user runs them ---------------------------------------------


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60, env=env
    )


def test_daemons_refuse_a_non_loopback_address_without_authentication(tmp_path: Path) -> None:
    coord = _run(
        "hetero.coordinator.cli", "serve", "--listen", "0.0.0.0:0", "--state-dir", str(tmp_path)
    )
    assert coord.returncode == 2
    assert coord.stderr.startswith("error: refusing to serve the coordinator on 0.0.0.0:0")
    assert coord.stderr.count("\n") == 1 and "Traceback" not in coord.stderr
    agent = _run(
        "hetero.agent.cli",
        "run",
        "--local-listen",
        "0.0.0.0:0",
        "--state-dir",
        str(tmp_path),
        *(("--allow-root",) if os.geteuid() == 0 else ()),
    )
    assert agent.returncode == 2
    assert agent.stderr.startswith("error: refusing to serve the agent endpoint on 0.0.0.0:0")
    assert agent.stderr.count("\n") == 1


def test_hetero_coord_with_a_token_and_a_wrong_token_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    log_path = tmp_path / "coord.log"
    # No token from the environment; the default state dir stays the test run's own.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HETERO_") or k == "HETERO_STATE_DIR"
    }
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "hetero.coordinator.cli", "serve"),
                *("--listen", "0.0.0.0:0", "--state-dir", str(tmp_path / "state")),
                *("--token-file", str(token_file)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in log_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.1)
        port = log_path.read_text().split("(port ")[1].split(",")[0]
        address = f"127.0.0.1:{port}"
        ok = _run(
            "hetero.coordinator.cli",
            "nodes",
            "--coordinator",
            address,
            "--token-file",
            str(token_file),
            env=env,
        )
        assert ok.returncode == 0, ok.stderr
        by_env = _run(
            "hetero.coordinator.cli",
            "jobs",
            "--coordinator",
            address,
            "--json",
            env={**env, "HETERO_TOKEN": TOKEN},
        )
        assert by_env.returncode == 0, by_env.stderr
        denied = _run("hetero.coordinator.cli", "nodes", "--coordinator", address, env=env)
        assert denied.returncode == 1
        assert denied.stderr == (
            "error: unauthenticated: the coordinator requires a token "
            "(--token-file or $HETERO_TOKEN_FILE)\n"
        )
        missing = _run(
            "hetero.coordinator.cli",
            "nodes",
            "--coordinator",
            address,
            "--token-file",
            str(tmp_path / "absent"),
            env=env,
        )
        assert missing.returncode == 2 and missing.stderr.startswith(
            "error: cannot read token file"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log_text = log_path.read_text()
    assert "token" in log_text and TOKEN not in log_text
    assert "without TLS the token crosses the network in clear" in log_text


E2E_JOB = """\
name: secured
model: debug
global_batch: 32
steps: 30
policy: dynamic
rebalance_interval: 5
resources:
  ranks: 2
  device: cpu
"""


@pytest.mark.slow
def test_a_job_runs_with_tokens_end_to_end_and_the_token_is_nowhere_on_disk(tmp_path: Path) -> None:
    """Coordinator and agents as processes with --token-file: the job succeeds, rank 0
    talked to its agent (with the agent's own token) without a failure, and the
    coordinator's token is in no database file, no daemon or rank log, no argv."""
    import psutil

    from hetero.bench.demo import summary_from_logs
    from hetero.bench.localcluster import AgentSpec, LocalCluster

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    root = tmp_path / "cluster"
    with LocalCluster(root, [AgentSpec("a"), AgentSpec("b")], token_file=token_file) as cluster:
        argv = " ".join(" ".join(psutil.Process(p.pid).cmdline()) for p in cluster.procs.values())
        assert TOKEN not in argv and "--token-file" in argv
        job = cluster.wait(cluster.submit(E2E_JOB), timeout_s=180)
        assert job.state == pb.JOB_STATE_SUCCEEDED, job.message
        summary = summary_from_logs(cluster.logs(job.id))
        assert summary is not None
        control = summary["control_plane"]
        # Reports never wait: on a loaded host a boundary whose predecessor's request is
        # still out goes unreported (skipped), so only the total is certain.
        assert control["calls"] >= 1 and control["failures"] == 0, control
        assert control["calls"] + control["skipped"] >= 2, control
        denied = _error(lambda: _nodes(cluster.address))
        assert denied.code() == grpc.StatusCode.UNAUTHENTICATED
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name.startswith("coordinator.db") for p in files)
    assert any(p.name == "rank0.log" for p in files)
    leaks = [p for p in files if TOKEN.encode() in p.read_bytes()]
    assert leaks == [], f"the token leaked into {leaks}"


def test_a_second_daemon_on_a_taken_port_is_refused(tmp_path: Path) -> None:
    """gRPC's default SO_REUSEPORT would let it bind and take half the agents."""
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    first, port = create_server("127.0.0.1:0", deps)
    try:
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            create_server(f"127.0.0.1:{port}", Settings(db_url=f"sqlite:///{tmp_path / 'd.db'}"))
        plans = PlanCache()
        local, local_port = create_local_server("127.0.0.1:0", AgentLocalService(None, plans))  # type: ignore[arg-type]
        try:
            with pytest.raises(ConfigError, match="cannot listen"):
                create_local_server(f"127.0.0.1:{local_port}", AgentLocalService(None, plans))  # type: ignore[arg-type]
        finally:
            local.stop(0).wait()
    finally:
        first.stop(0).wait()
