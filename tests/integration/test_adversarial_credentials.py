"""Attack: a credential speaks for a node or a user it is not (issue 17, item 4).

With one ``agent`` token for every node, an agent host could heartbeat as
another node, re-register it with a new address, or forge a rank's exit on
another node; with one ``user`` token, any user could cancel anyone's job. A
node's and a user's own credential (``hetero.security.credentials``) binds the call to
its holder and the coordinator checks what each call acts on
(``coordinator.scope``). Real coordinator on port 0, SQLite under tmp_path;
the last test runs real daemons.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from pki import make_pki
from simcluster import watch_orders
from sqlalchemy import event

from hetero.coordinator import cli
from hetero.coordinator.admission import Limits
from hetero.coordinator.config import load_config
from hetero.coordinator.roles import NAMED, certificate_callers, named_credentials
from hetero.coordinator.server import CoordinatorServer, Settings, create_server
from hetero.core.errors import ConfigError
from hetero.security.auth import Secret, new_token
from hetero.security.credentials import Named, NamedCredentials, check_holder
from hetero.security.transport import ClientSecurity, ServerSecurity, TLSFiles, client_channel
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
DENIED = grpc.StatusCode.PERMISSION_DENIED
JOB = "name: pair\nmodel: debug\nglobal_batch: 8\nsteps: 5\nresources:\n  ranks: 2\n  device: cpu\n"


@dataclass
class Served:
    address: str
    cluster: Secret
    credentials: NamedCredentials
    server: CoordinatorServer

    def stub(self, token: Secret) -> pb_grpc.CoordinatorStub:
        channel = client_channel(self.address, ClientSecurity(token=token))
        return pb_grpc.CoordinatorStub(channel)

    def node(self, name: str) -> pb_grpc.CoordinatorStub:
        return self.stub(self.credentials.mint("node", name))

    def user(self, name: str) -> pb_grpc.CoordinatorStub:
        return self.stub(self.credentials.mint("user", name))


@contextlib.contextmanager
def _serving(
    settings: Settings, cluster: Secret, credentials: NamedCredentials
) -> Iterator[Served]:
    security = ServerSecurity(token=cluster, named=credentials)
    server, port = create_server("127.0.0.1:0", settings, security)
    server.start()
    try:
        yield Served(f"127.0.0.1:{port}", cluster, credentials, server)
    finally:
        server.stop(0).wait()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    # One rank per CPU device, so a 2-rank job puts one rank on each of two nodes.
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", limits=Limits(ranks_per_cpu_device=1)
    )
    with _serving(settings, new_token(), NamedCredentials(new_token(), NAMED)) as served:
        yield served


def _register(stub: pb_grpc.CoordinatorStub, name: str, address: str = "10.0.0.2") -> str:
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    req = pb.RegisterNodeRequest(name=name, address=address, devices=[device])
    return str(stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _denied(call: Callable[[], object], code: grpc.StatusCode = DENIED) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    return str(err.value.details())


def _heartbeat(stub: pb_grpc.CoordinatorStub, node_id: str) -> object:
    return stub.Heartbeat(pb.HeartbeatRequest(node_id=node_id), timeout=DEADLINE_S)


def test_a_node_credential_heartbeats_and_registers_only_as_its_own_node(served: Served) -> None:
    a, b = served.node("node-a"), served.node("node-b")
    a_id, b_id = _register(a, "node-a"), _register(b, "node-b")
    _heartbeat(a, a_id)
    watch_orders(a, a_id)
    message = _denied(lambda: _heartbeat(a, b_id))
    assert message == (
        f"permission denied: node:node-a may not call Heartbeat for node {b_id} (it is node node-b)"
    )
    _denied(lambda: watch_orders(a, b_id))
    hijack = _denied(lambda: _register(a, "node-b", address="6.6.6.6"))
    assert (
        hijack
        == "permission denied: node:node-a may not register node 'node-b' (it is node node-a)"
    )
    submit = _denied(lambda: a.SubmitJob(pb.SubmitJobRequest(spec_yaml=JOB), timeout=5))
    assert submit == "permission denied: node:node-a may not call SubmitJob"
    nodes = served.stub(served.cluster).ListNodes(pb.ListNodesRequest(), timeout=5).nodes
    assert {n.name: n.address for n in nodes} == {"node-a": "10.0.0.2", "node-b": "10.0.0.2"}


def test_after_a_restart_the_database_binds_node_ids_to_names(
    served: Served, tmp_path: Path
) -> None:
    """A restarted coordinator binds node ids to names as it loads its state."""
    a_id = _register(served.node("node-a"), "node-a")
    b_id = _register(served.node("node-b"), "node-b")
    served.server.stop(0).wait()
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    with _serving(settings, served.cluster, served.credentials) as again:
        _denied(lambda: _heartbeat(again.node("node-a"), b_id))
        _heartbeat(again.node("node-a"), a_id)
        _heartbeat(again.node("node-a"), a_id)
        unknown = _denied(
            lambda: _heartbeat(again.node("node-a"), "0" * 12), grpc.StatusCode.NOT_FOUND
        )
        assert "register first" in unknown  # the agent's cue to register again


def _placed_pair(served: Served, spec: str = JOB) -> tuple[str, dict[str, str], dict[str, int]]:
    """A 2-rank job with one rank on node-a and one on node-b (and node-c with none):
    its id, the nodes' ids and the rank each node holds."""
    ids = {n: _register(served.node(n), n) for n in ("node-a", "node-b", "node-c")}
    cluster = served.stub(served.cluster)
    _heartbeat(served.node("node-c"), ids["node-c"])
    drain = pb.DrainNodeRequest(node="node-c")
    cluster.DrainNode(drain, timeout=DEADLINE_S)  # no rank on node-c
    job = cluster.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S).job
    names = {v: k for k, v in ids.items()}
    ranks = {names[r.node_id]: r.rank for r in job.ranks}
    assert set(ranks) == {"node-a", "node-b"}, job
    return job.id, ids, ranks


def test_a_node_cannot_report_log_or_plan_for_ranks_on_another_node(served: Served) -> None:
    job_id, ids, ranks = _placed_pair(served)
    a = served.node("node-a")
    forged = pb.ReportRankStatusRequest(
        node_id=ids["node-b"],
        job_id=job_id,
        rank=ranks["node-b"],
        state=pb.RANK_STATE_EXITED,
        exit_code=0,
    )
    message = _denied(lambda: a.ReportRankStatus(forged, timeout=DEADLINE_S))
    assert message.startswith(
        "permission denied: node:node-a may not call ReportRankStatus for node"
    )
    lines = [
        pb.LogLine(rank=ranks["node-b"], text="forged"),
        pb.LogLine(rank=ranks["node-a"], text="ok"),
    ]
    logs = pb.AppendJobLogsRequest(job_id=job_id, lines=lines)
    message = _denied(lambda: a.AppendJobLogs(logs, timeout=DEADLINE_S))
    assert message == (
        f"permission denied: node:node-a may not append log lines of job {job_id} "
        f"rank {ranks['node-b']} (not placed on node node-a)"
    )
    own = pb.AppendJobLogsRequest(job_id=job_id, lines=lines[1:])
    a.AppendJobLogs(own, timeout=DEADLINE_S)
    c = served.node("node-c")
    plan = _denied(lambda: c.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S))
    assert (
        plan
        == f"permission denied: node:node-c may not call GetPlan for job {job_id} (no rank on node node-c)"
    )
    report = tpb.IntervalReport(job_id=job_id)
    _denied(lambda: c.ReportIntervalStats(report, timeout=DEADLINE_S))
    assert a.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S).version >= 1
    # Its own rank: the report is taken, and the job is not SUCCEEDED by a forgery.
    mine = pb.ReportRankStatusRequest(
        node_id=ids["node-a"], job_id=job_id, rank=ranks["node-a"], state=pb.RANK_STATE_RUNNING
    )
    a.ReportRankStatus(mine, timeout=DEADLINE_S)
    job = served.stub(served.cluster).GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
    assert job.state != pb.JOB_STATE_SUCCEEDED
    got = served.stub(served.cluster).GetJobLogs(pb.GetJobLogsRequest(job_id=job_id), timeout=5)
    assert [ln.text for ln in got.lines] == ["ok"]


def test_a_user_cancels_only_their_own_jobs_and_is_limited_by_name(tmp_path: Path) -> None:
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}", limits=Limits(jobs_per_user=1))
    with _serving(deps, new_token(), NamedCredentials(new_token(), NAMED)) as served:
        _register(served.stub(served.cluster), "node-a")
        ana, bob = served.user("ana"), served.user("bob")
        spec = pb.SubmitJobRequest(spec_yaml=JOB.replace("ranks: 2", "ranks: 1"))
        anas = ana.SubmitJob(spec, timeout=DEADLINE_S).job_id
        over = _denied(lambda: ana.SubmitJob(spec, timeout=5), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert over.startswith("user:ana has 1 queued or active jobs"), over
        bobs = bob.SubmitJob(spec, timeout=DEADLINE_S).job_id  # his own budget
        cancel = pb.CancelJobRequest(job_id=anas)
        message = _denied(lambda: bob.CancelJob(cancel, timeout=DEADLINE_S))
        assert (
            message
            == f"permission denied: user:bob may not cancel job {anas} (submitted by user:ana)"
        )
        drain = _denied(lambda: bob.DrainNode(pb.DrainNodeRequest(node="node-a"), timeout=5))
        assert drain == "permission denied: user:bob may not call DrainNode"
        assert ana.CancelJob(cancel, timeout=DEADLINE_S).state == pb.JOB_STATE_CANCELLED
        admin = served.stub(served.cluster)
        admin.CancelJob(pb.CancelJobRequest(job_id=bobs), timeout=DEADLINE_S)  # the admin: any


def test_a_user_reads_only_their_own_jobs_and_the_read_role_reads_all(tmp_path: Path) -> None:
    """A user's credential lists, reads, follows and watches its own jobs alone, whether
    the coordinator holds the job or reads it from its database; the read token and
    the cluster token read every job (issue #33: any user read every job's spec and logs)."""
    from handclock import Clock

    from hetero.coordinator.roles import ROLES
    from hetero.security.auth import RoleToken

    clock = Clock()
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}", clock=clock)
    cluster, reader, named = new_token(), new_token(), NamedCredentials(new_token(), NAMED)
    security = ServerSecurity(
        token=cluster, roles=(RoleToken("read", reader, ROLES["read"]),), named=named
    )
    server, port = create_server("127.0.0.1:0", settings, security)
    server.start()
    served = Served(f"127.0.0.1:{port}", cluster, named, server)
    try:
        admin = served.stub(cluster)
        device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1)
        node = pb.RegisterNodeRequest(name="node-a", address="10.0.0.2", devices=[device])
        admin.RegisterNode(node, timeout=DEADLINE_S)
        ana, bob = served.user("ana"), served.user("bob")
        spec = pb.SubmitJobRequest(spec_yaml=JOB.replace("ranks: 2", "ranks: 1"))
        anas = ana.SubmitJob(spec, timeout=DEADLINE_S).job_id
        bobs = bob.SubmitJob(spec, timeout=DEADLINE_S).job_id
        line = pb.LogLine(rank=0, text="bob's secret")
        admin.AppendJobLogs(pb.AppendJobLogsRequest(job_id=bobs, lines=[line]), timeout=5)

        def reads_of_bobs_job(who: pb_grpc.CoordinatorStub) -> list[str]:
            return [
                _denied(lambda: who.GetJob(pb.GetJobRequest(job_id=bobs), timeout=5)),
                _denied(lambda: who.GetJobDetail(pb.GetJobDetailRequest(job_id=bobs), timeout=5)),
                _denied(lambda: who.GetJobLogs(pb.GetJobLogsRequest(job_id=bobs), timeout=5)),
            ]

        refused = f"permission denied: user:ana may not read job {bobs} (submitted by user:bob)"
        assert reads_of_bobs_job(ana) == [refused] * 3
        listed = ana.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
        assert [j.id for j in listed.jobs] == [anas] and listed.total == 1
        watch = ana.WatchCluster(pb.WatchClusterRequest(), timeout=DEADLINE_S)
        snapshot = next(iter(watch))
        watch.cancel()
        assert [j.id for j in snapshot.jobs] == [anas]
        assert [n.name for n in snapshot.nodes] == ["node-a"], "nodes are everyone's to see"
        assert ana.GetJob(pb.GetJobRequest(job_id=anas), timeout=DEADLINE_S).id == anas
        for everyone in (served.stub(reader), admin):
            listed = everyone.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
            assert {j.id for j in listed.jobs} == {anas, bobs} and listed.total == 2
            logs = everyone.GetJobLogs(pb.GetJobLogsRequest(job_id=bobs), timeout=DEADLINE_S)
            assert [x.text for x in logs.lines] == ["bob's secret"]
        # A job that ended long ago is read from the database: checked by its stored owner.
        admin.CancelJob(pb.CancelJobRequest(job_id=bobs), timeout=DEADLINE_S)
        clock.now += 2 * 3600
        server.sweep()
        assert bobs not in {j.id for j in server.snapshot().jobs}, "no longer held"
        assert reads_of_bobs_job(ana) == [refused] * 3
        assert bob.GetJob(pb.GetJobRequest(job_id=bobs), timeout=DEADLINE_S).id == bobs
    finally:
        server.stop(0).wait()


def test_forged_revoked_and_foreign_credentials_are_unauthenticated(tmp_path: Path) -> None:
    secret = new_token()
    revoking = NamedCredentials(secret, NAMED, revoked=("node:node-b",))
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    with _serving(settings, new_token(), revoking) as served:
        good = served.credentials.mint("node", "node-a").reveal()
        forged = good.replace("node:node-a:", "node:node-b:")  # a's MAC under b's name
        foreign = NamedCredentials(new_token(), NAMED).mint("node", "node-a")  # another secret
        for token in (Secret(forged), foreign, served.credentials.mint("node", "node-b")):
            stub = served.stub(token)
            code = grpc.StatusCode.UNAUTHENTICATED
            _denied(lambda stub=stub: stub.ListNodes(pb.ListNodesRequest(), timeout=5), code)  # type: ignore[misc]
        _register(served.node("node-a"), "node-a")


def test_client_certificates_map_onto_the_same_roles(tmp_path: Path) -> None:
    """Mutual TLS with ``certificates:``: a certificate is a user, a node, a reader or
    an admin, with the same limits as that holder's token; an unmapped one is nothing."""
    pki = make_pki(tmp_path, clients=("ana", "gpu-a", "top", "ops", "eve"))
    mapping = {"ana": "user", "gpu-a": "node:node-a", "top": "read", "ops": "admin"}
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    tls = TLSFiles(pki.server_cert, pki.server_key, pki.ca)
    named = NamedCredentials(new_token(), NAMED)
    cluster = new_token()
    security = ServerSecurity(token=cluster, tls=tls, named=named, certificate_callers=True)
    server, port = create_server(
        "127.0.0.1:0", deps, security, certificate_callers(mapping.items())
    )
    server.start()

    def stub(cn: str, token: Secret | None = None) -> pb_grpc.CoordinatorStub:
        cert, key = pki.clients[cn]
        client = ClientSecurity(token=token, tls=TLSFiles(cert, key, pki.ca))
        return pb_grpc.CoordinatorStub(client_channel(f"localhost:{port}", client))

    try:
        node = stub("gpu-a")
        _register(node, "node-a")
        hijack = _denied(lambda: _register(node, "node-b"))
        assert (
            hijack
            == "permission denied: node:node-a may not register node 'node-b' (it is node node-a)"
        )
        spec = pb.SubmitJobRequest(spec_yaml=JOB.replace("ranks: 2", "ranks: 1"))
        by_cert = stub("ana").SubmitJob(spec, timeout=DEADLINE_S).job_id
        # ana by certificate and ana by token are one user: her token may cancel it.
        ana_token = stub("eve", named.mint("user", "ana"))
        ana_token.CancelJob(pb.CancelJobRequest(job_id=by_cert), timeout=DEADLINE_S)
        theirs = stub("ops").SubmitJob(spec, timeout=DEADLINE_S).job_id
        cancel = pb.CancelJobRequest(job_id=theirs)
        _denied(lambda: stub("ana").CancelJob(cancel, timeout=DEADLINE_S))
        read = stub("top")
        read.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
        refused = _denied(lambda: read.SubmitJob(spec, timeout=DEADLINE_S))
        assert refused == "permission denied: certificate CN=top may not call SubmitJob (read role)"
        watch = read.WatchCluster(pb.WatchClusterRequest(), timeout=DEADLINE_S)
        assert next(iter(watch)).nodes[0].name == "node-a"
        watch.cancel()
        nodes = node.WatchCluster(pb.WatchClusterRequest(), timeout=DEADLINE_S)
        _denied(lambda: next(iter(nodes)))
        stranger = _denied(lambda: stub("eve").ListJobs(pb.ListJobsRequest(), timeout=5))
        assert stranger == "permission denied: certificate CN=eve may not call ListJobs (no role)"
        stub("ops").CancelJob(cancel, timeout=DEADLINE_S)  # an admin certificate: any job
        stub("eve", cluster).ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)  # token wins
    finally:
        server.stop(0).wait()


def test_certificates_and_credentials_in_the_config_are_checked_by_name(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.yaml"
    path.write_text("certificates:\n  ana: usr\n")
    config = load_config(path)
    with pytest.raises(ConfigError, match=r"certificates\.ana: unknown role 'usr' \(known: admin"):
        certificate_callers(config.certificates)
    path.write_text("credentials:\n  secret: /x\n")
    with pytest.raises(
        ConfigError, match=r"credentials\.secret: unknown field \(did you mean 'secret_file'"
    ):
        load_config(path)
    secret = tmp_path / "secret"
    path.write_text(f"credentials:\n  secret_file: {secret}\n  revoked: [node:node-b, nod:x]\n")
    config = load_config(path)
    assert config.resolved_credential_secret == secret and config.revoked == (
        "node:node-b",
        "nod:x",
    )
    with pytest.raises(ConfigError, match="unknown credential kind 'nod'"):
        named_credentials(secret, config.revoked)
    assert named_credentials(secret) is None, "no secret file: no named credentials"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_node_token_prints_the_same_credential_the_coordinator_accepts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    code, first, _ = _cli("node-token", "gpu-3", "--state-dir", str(state))
    assert code == 0 and first.startswith("node:gpu-3:")
    assert (state / "credential-secret").stat().st_mode & 0o777 == 0o600
    assert _cli("node-token", "gpu-3", "--state-dir", str(state))[1] == first, "derived, not random"
    out = tmp_path / "ana.token"
    code, _, said = _cli("user-token", "ana", "--state-dir", str(state), "--out", str(out))
    assert code == 0 and said == f"user ana: credential written to {out}\n"
    assert os.stat(out).st_mode & 0o777 == 0o600
    credentials = named_credentials(state / "credential-secret")
    assert credentials is not None
    assert credentials.verify(first.strip()) == Named("node", "gpu-3")
    assert credentials.verify(out.read_text().strip()) == Named("user", "ana")
    code, _, err = _cli("node-token", "bad name", "--state-dir", str(state))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: node name 'bad name'")


def test_an_agent_refuses_another_nodes_credential() -> None:
    credentials = NamedCredentials(new_token(), NAMED)
    check_holder(credentials.mint("node", "gpu-3"), "node", "gpu-3")
    check_holder(new_token(), "node", "gpu-3")  # a cluster or role token: not named
    with pytest.raises(
        ConfigError, match="the token is node gpu-4's credential, but this node is 'gpu-3'"
    ):
        check_holder(credentials.mint("node", "gpu-4"), "node", "gpu-3")
    with pytest.raises(ConfigError, match="the token is user ana's credential"):
        check_holder(credentials.mint("user", "ana"), "node", "gpu-3")


E2E_JOB = """\
name: bound
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
def test_agents_with_their_node_credentials_run_a_job_to_success(tmp_path: Path) -> None:
    """Coordinator and two agents as processes, each agent with its own node's
    credential from ``hetero-coord node-token``: registration, heartbeats, orders,
    rank states, logs and rank 0's reports all pass the node checks, the job
    succeeds, and one agent's credential still cannot heartbeat as the other node."""
    from hetero.bench.demo import summary_from_logs
    from hetero.bench.localcluster import AgentSpec, LocalCluster
    from hetero.security.auth import read_token_file

    root = tmp_path / "cluster"
    with LocalCluster(root, [AgentSpec("a"), AgentSpec("b")], node_credentials=True) as cluster:
        job = cluster.wait(cluster.submit(E2E_JOB), timeout_s=180)
        assert job.state == pb.JOB_STATE_SUCCEEDED, job.message
        assert {r.node_name for r in job.ranks} == {"a", "b"}, job.ranks
        summary = summary_from_logs(cluster.logs(job.id))
        assert summary is not None and summary["control_plane"]["failures"] == 0, summary
        nodes = cluster.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
        b_id = next(n.id for n in nodes if n.name == "b")
        a = pb_grpc.CoordinatorStub(
            client_channel(cluster.address, ClientSecurity(read_token_file(root / "a.token")))
        )
        _denied(lambda: _heartbeat(a, b_id))


def test_mutual_tls_alone_still_admits_certificates_beside_node_credentials(
    tmp_path: Path,
) -> None:
    """A coordinator on mutual TLS with no token (the certificate is the credential)
    keeps admitting certificate callers now that node and user credentials are on."""
    from hetero.coordinator.access import with_access
    from hetero.coordinator.config import CoordinatorConfig

    pki = make_pki(tmp_path)
    tls = TLSFiles(pki.server_cert, pki.server_key, pki.ca)
    config = CoordinatorConfig(state_dir=tmp_path / "state")
    security, certificates = with_access(config, ServerSecurity(tls=tls))
    assert security.named is not None and security.certificate_callers and not certificates
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    server, port = create_server("127.0.0.1:0", deps, security, certificates)
    server.start()
    try:
        for token in (None, security.named.mint("node", "node-a")):
            client = ClientSecurity(token, TLSFiles(pki.client_cert, pki.client_key, pki.ca))
            stub = pb_grpc.CoordinatorStub(client_channel(f"localhost:{port}", client))
            _register(stub, "node-a")
        named = ClientSecurity(security.named.mint("node", "node-b"), client.tls)
        bound = pb_grpc.CoordinatorStub(client_channel(f"localhost:{port}", named))
        _denied(lambda: _register(bound, "node-a"))
    finally:
        server.stop(0).wait()


def test_a_nodes_plan_reads_come_from_memory_and_follow_a_restart_off_the_node(
    tmp_path: Path,
) -> None:
    """A node's ``GetPlan`` is checked and answered from the coordinator's state, without
    a query, and a restart that moves the job off the node takes the node's access with
    it at once."""
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", limits=Limits(ranks_per_cpu_device=1)
    )
    statements: list[str] = []
    with _serving(settings, new_token(), NamedCredentials(new_token(), NAMED)) as served:
        engine = served.server.engine
        job_id, ids, ranks = _placed_pair(served, JOB + "max_restarts: 1\n")
        b, c = served.node("node-b"), served.node("node-c")
        plan = tpb.GetPlanRequest(job_id=job_id)
        assert b.GetPlan(plan, timeout=DEADLINE_S).version == 1  # reads, then remembers
        event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        assert b.GetPlan(plan, timeout=DEADLINE_S).version == 1
        refused = _denied(lambda: c.GetPlan(plan, timeout=DEADLINE_S))
        assert refused.endswith("(no rank on node node-c)")
        assert statements == [], "checked and answered from memory"

        cluster = served.stub(served.cluster)
        cluster.DrainNode(pb.DrainNodeRequest(node="node-b"), timeout=DEADLINE_S)
        cluster.DrainNode(pb.DrainNodeRequest(node="node-c", undrain=True), timeout=DEADLINE_S)
        _heartbeat(c, ids["node-c"])
        for node, code in (("node-b", 1), ("node-a", 143)):  # b's rank fails; a's is stopped
            exited = pb.ReportRankStatusRequest(
                node_id=ids[node],
                job_id=job_id,
                rank=ranks[node],
                state=pb.RANK_STATE_EXITED,
                exit_code=code,
            )
            served.node(node).ReportRankStatus(exited, timeout=DEADLINE_S)
        job = cluster.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
        assert job.restarts == 1 and {r.node_name for r in job.ranks} == {"node-a", "node-c"}
        refused = _denied(lambda: b.GetPlan(plan, timeout=DEADLINE_S))
        assert refused.endswith("(no rank on node node-b)")
        assert c.GetPlan(plan, timeout=DEADLINE_S).version == job.plan.version


def test_a_user_reports_and_detaches_only_the_jobs_it_attached(served: Served) -> None:
    """Attaching lets a user's credential report intervals (issue #35): only for jobs it
    attached, never for a job the coordinator launched, whose agents report for it."""
    placed, _, _ = _placed_pair(served)
    ana, bob = served.user("ana"), served.user("bob")
    rank = pb.AttachedRank(host="h", device_name="cpu", device_kind=tpb.DEVICE_KIND_CPU)
    request = pb.AttachJobRequest(name="mine", launcher="slurm", global_batch=8, ranks=[rank] * 2)
    attached = ana.AttachJob(request, timeout=DEADLINE_S)
    assert attached.plan.batches == [4, 4]
    ask = tpb.GetPlanRequest(job_id=placed)
    message = _denied(lambda: ana.GetPlan(ask, timeout=DEADLINE_S))
    assert message == (
        f"permission denied: user:ana may not call GetPlan for job {placed} (its agents report for it)"
    )
    detach = pb.DetachJobRequest(job_id=attached.job_id)
    message = _denied(lambda: bob.DetachJob(detach, timeout=DEADLINE_S))
    assert message == (
        f"permission denied: user:bob may not call DetachJob for job {attached.job_id} "
        "(attached by user:ana)"
    )
    assert ana.GetPlan(tpb.GetPlanRequest(job_id=attached.job_id), timeout=DEADLINE_S).version == 1
    assert ana.DetachJob(detach, timeout=DEADLINE_S).state == pb.JOB_STATE_SUCCEEDED
