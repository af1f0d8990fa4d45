"""Attack: one token is every role (issue 17, item 4).

Before roles, a user's token could re-register a node under its id with a new
address (hijacking rendezvous and launch orders), forge a rank's EXITED 0
(marking the job SUCCEEDED) and append log lines as any rank. With ``roles:``
in coordinator.yaml each role's token calls only its role's methods
(``coordinator.roles``). Real coordinator on port 0, SQLite under tmp_path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hetero.coordinator.config import load_config
from hetero.coordinator.roles import AGENT, ROLES, SERVICE, USER, load_roles
from hetero.coordinator.server import Settings, create_server
from hetero.core.errors import ConfigError
from hetero.security.auth import Secret, new_token
from hetero.security.transport import ClientSecurity, ServerSecurity, client_channel
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
DENIED = grpc.StatusCode.PERMISSION_DENIED


@dataclass
class Served:
    address: str
    tokens: dict[str, Secret]

    def stub(self, role: str) -> pb_grpc.CoordinatorStub:
        channel = client_channel(self.address, ClientSecurity(token=self.tokens[role]))
        return pb_grpc.CoordinatorStub(channel)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    tokens = {"cluster": new_token(), **{role: new_token() for role in ROLES}}
    files = []
    for role in ROLES:
        path = tmp_path / f"{role}.token"
        path.write_text(tokens[role].reveal())
        path.chmod(0o600)
        files.append((role, path))
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    security = ServerSecurity(token=tokens["cluster"], roles=load_roles(files))
    server, port = create_server("127.0.0.1:0", deps, security)
    server.start()
    try:
        yield Served(f"127.0.0.1:{port}", tokens)
    finally:
        server.stop(0).wait()


def _register(stub: pb_grpc.CoordinatorStub, address: str = "10.0.0.2") -> str:
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    req = pb.RegisterNodeRequest(name="node-a", address=address, devices=[device])
    return str(stub.RegisterNode(req, timeout=DEADLINE_S).node_id)


def _denied(call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == DENIED, err.value.details()
    return str(err.value.details())


def test_a_user_token_cannot_act_as_an_agent(served: Served) -> None:
    node_id = _register(served.stub("agent"))
    user = served.stub("user")
    message = _denied(lambda: _register(user, address="6.6.6.6"))  # hijack the node
    assert message == "permission denied: the user token may not call RegisterNode"
    forged = pb.ReportRankStatusRequest(node_id=node_id, job_id="j", rank=0)
    _denied(lambda: user.ReportRankStatus(forged, timeout=DEADLINE_S))  # a forged EXITED 0
    logs = pb.AppendJobLogsRequest(job_id="j", lines=[pb.LogLine(rank=0, text="forged")])
    _denied(lambda: user.AppendJobLogs(logs, timeout=DEADLINE_S))  # lines as any rank
    _denied(lambda: user.Heartbeat(pb.HeartbeatRequest(node_id=node_id), timeout=DEADLINE_S))
    nodes = served.stub("read").ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes
    assert [n.address for n in nodes] == ["10.0.0.2"], "the node keeps its address"


def test_an_agent_token_cannot_submit_and_a_read_token_only_reads(served: Served) -> None:
    spec = pb.SubmitJobRequest(spec_yaml="name: x\n")
    _denied(lambda: served.stub("agent").SubmitJob(spec, timeout=DEADLINE_S))
    read = served.stub("read")
    read.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
    read.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S)
    _denied(lambda: read.SubmitJob(spec, timeout=DEADLINE_S))
    _denied(lambda: read.CancelJob(pb.CancelJobRequest(job_id="x"), timeout=DEADLINE_S))
    _denied(lambda: read.DrainNode(pb.DrainNodeRequest(node="x"), timeout=DEADLINE_S))


def test_the_cluster_token_still_calls_everything_and_a_stranger_nothing(served: Served) -> None:
    cluster = served.stub("cluster")
    _register(cluster)
    cluster.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
    stranger = pb_grpc.CoordinatorStub(grpc.insecure_channel(served.address))
    with pytest.raises(grpc.RpcError) as err:
        stranger.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_every_method_belongs_to_a_role_and_roles_split_as_documented() -> None:
    every = {f"/{SERVICE.full_name}/{m.name}" for m in SERVICE.methods}
    assert set().union(*ROLES.values()) == every, "a new RPC needs a role"
    # Besides Probe, a user shares with agents the two calls an attached job's rank 0
    # makes; ``scope`` keeps a user to the jobs it attached (test_adversarial_credentials).
    shared = {f"/{SERVICE.full_name}/{m}" for m in ("Probe", "ReportIntervalStats", "GetPlan")}
    assert not (USER & AGENT) - shared, "no write shared by both"


def test_roles_in_the_config_file_are_checked_by_name(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.yaml"
    path.write_text(f"roles:\n  reader: {tmp_path / 'r.token'}\n")
    with pytest.raises(ConfigError, match=r"roles\.reader: unknown field \(did you mean 'read'"):
        load_config(path)
    token = tmp_path / "r.token"
    token.write_text("r" * 32)
    path.write_text(f"roles:\n  read: {token}\n")
    assert load_config(path).roles == (("read", token),)


def test_a_ranks_token_is_good_for_its_own_job_only(served: Served) -> None:
    """Before: every rank of an agent shared one endpoint token, good for any job."""
    from hetero.agent.local import AgentLocalService, PlanCache, create_local_server
    from hetero.agent.orders import rank_process
    from hetero.security.auth import AGENT_TOKEN_ENV, JobTokens
    from hetero.v1 import agent_pb2_grpc

    tokens = JobTokens(new_token())
    order = pb.RankLaunch(job_id="job-a", rank=0, world_size=1, master_port=29500)
    env = rank_process(
        order,
        python="python3",
        output_dir=Path("/tmp/out"),
        agent_endpoint="127.0.0.1:7071",
        threads=1,
        local_world_size=1,
        base={"HETERO_TOKEN": served.tokens["cluster"].reveal(), "PATH": "/usr/bin"},
        agent_token=tokens.for_job("job-a"),
    ).env
    assert served.tokens["cluster"].reveal() not in env.values(), "never the cluster's token"
    rank_token = Secret(env[AGENT_TOKEN_ENV])
    # The forward deadline is the test's, not the agent's 0.4 s: on a loaded two-core runner the
    # first forward can take longer, and the agent then answers UNAVAILABLE by design.
    service = AgentLocalService(
        served.stub("agent"), PlanCache(), forward_timeout_s=DEADLINE_S, job_tokens=tokens
    )
    server, port = create_local_server("127.0.0.1:0", service)
    server.start()
    try:
        with client_channel(f"127.0.0.1:{port}", ClientSecurity(token=rank_token)) as channel:
            local = agent_pb2_grpc.AgentLocalStub(channel)
            for job in ("job-b", ""):
                with pytest.raises(grpc.RpcError) as err:
                    local.GetPlan(tpb.GetPlanRequest(job_id=job), timeout=DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.RpcError) as err:
                    report = tpb.IntervalReport(job_id=job)
                    local.ReportIntervalStats(report, timeout=DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as own:  # its own job: forwarded upstream
                local.GetPlan(tpb.GetPlanRequest(job_id="job-a"), timeout=DEADLINE_S)
            assert own.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop(0).wait()
