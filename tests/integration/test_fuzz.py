"""Bad input, fuzzed: job specs and every RPC of the Coordinator and AgentLocal services.

Real servers on port 0, a real SQLite file. For every generated request:
the status is a deliberate one (never UNKNOWN or INTERNAL, never a hang), a
rejection says why in one line without a traceback, and a rejected call leaves
every table of the database exactly as it was.

``HETERO_FUZZ_EXAMPLES`` (default 40 per RPC, 300 for the spec parser) runs
deeper, e.g. ``HETERO_FUZZ_EXAMPLES=1000 pytest tests/integration/test_fuzz.py``.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from fuzzing import job_specs, messages
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero.agent.local import AgentLocalService, PlanCache, create_local_server
from hetero.coordinator.placement import DeviceSlot, place, predict
from hetero.coordinator.wire import dry_run_job, prediction_message
from hetero.core.errors import ConfigError, HeteroError
from hetero.core.jobspec import parse_jobspec
from hetero.v1 import agent_pb2, coordinator_pb2, coordinator_pb2_grpc
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

EXAMPLES = int(os.environ.get("HETERO_FUZZ_EXAMPLES", "40"))
SPEC_EXAMPLES = int(os.environ.get("HETERO_FUZZ_EXAMPLES", "300"))
TIMEOUT_S = 10.0
#: Codes a handler may answer with; UNKNOWN, INTERNAL, UNAVAILABLE, DEADLINE_EXCEEDED never.
DELIBERATE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
COORDINATOR = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]
AGENT_LOCAL = agent_pb2.DESCRIPTOR.services_by_name["AgentLocal"]
SEED_JOB = """\
name: seeded
model: debug
global_batch: 16
steps: 20
rebalance_interval: 5
resources: {ranks: 2, device: cpu}
"""


def database_digest(db_path: Path) -> str:
    """A hash of every row of every table, read through a separate read-only connection."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        h = hashlib.sha256()
        tables = con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        for (table,) in tables.fetchall():
            h.update(table.encode())
            for row in con.execute(f'SELECT * FROM "{table}" ORDER BY rowid'):
                h.update(repr(row).encode())
        return h.hexdigest()
    finally:
        con.close()


def _call(channel: grpc.Channel, service: str, method: str, request: bytes) -> grpc.StatusCode:
    """Send raw request bytes; the status code (OK if it answered)."""
    rpc = channel.unary_unary(f"/{service}/{method}")
    try:
        rpc(request, timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        details = exc.details() or ""
        assert exc.code() in DELIBERATE, f"{method}: {exc.code()} {details}"
        assert details and "\n" not in details and "Traceback" not in details, details
        assert len(details) <= 1000, f"{method}: a {len(details)}-character message"
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _seed(c) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """A node with two CPU devices and a pending job: ids the fuzzer can aim at."""
    devices = [
        tpb.DeviceProfile(index=i, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
        for i in range(2)
    ]
    node_id = c.stub.RegisterNode(
        pb.RegisterNodeRequest(name="n1", address="127.0.0.1", devices=devices), timeout=TIMEOUT_S
    ).node_id
    job_id = c.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=SEED_JOB), timeout=TIMEOUT_S).job_id
    return {
        "node_id": [node_id],
        "job_id": [job_id],
        "node": [node_id, "n1"],
        "name": ["n1", "n2"],
        "*": [job_id, node_id],
    }


def _shaped(name: str, pools: dict[str, list[str]]) -> st.SearchStrategy[object] | None:
    """Requests valid in shape but wild in value, so fuzzing gets past the first check."""
    job_id, node_id = st.sampled_from(pools["job_id"]), st.sampled_from(pools["node_id"])
    floats = st.one_of(st.floats(), st.floats(0, 10))
    if name == "ReportIntervalStats":
        stats = st.builds(
            tpb.RankIntervalStats,
            batch=st.integers(-2, 2**31 - 1),
            steps=st.integers(-2, 2**31 - 1),
            compute_s=floats,
            step_s=floats,
            peak_memory_bytes=st.integers(-(2**63), 2**63 - 1),
            data_s=floats,
            loss_sum=floats,
            samples=st.integers(-(2**63), 2**63 - 1),
        )

        def report(job: str, step: int, version: int, ranks: list[tpb.RankIntervalStats]) -> object:
            for r, stat in enumerate(ranks):
                stat.rank = r
            return tpb.IntervalReport(job_id=job, end_step=step, plan_version=version, ranks=ranks)

        return st.builds(
            report,
            job_id,
            st.integers(-1, 2**63 - 1),
            st.integers(-1, 2**63 - 1),
            st.lists(stats, min_size=2, max_size=2),
        )
    if name == "ReportRankStatus":
        return st.builds(
            pb.ReportRankStatusRequest,
            node_id=node_id,
            job_id=job_id,
            rank=st.integers(-1, 3),
            state=st.sampled_from([pb.RANK_STATE_RUNNING, pb.RANK_STATE_EXITED]),
            exit_code=st.integers(-(2**31), 2**31 - 1),
        )
    if name == "RegisterNode":
        device = st.builds(
            tpb.DeviceProfile,
            index=st.integers(-1, 3),
            kind=st.integers(-1, 3),
            compute_score=floats,
            memory_bytes=st.integers(-(2**63), 2**63 - 1),
            emulated_slowdown=floats,
        )
        return st.builds(
            pb.RegisterNodeRequest,
            name=st.sampled_from(["n1", "n2", "x" * 300, "é"]),
            address=st.sampled_from(["127.0.0.1", "::1", "host"]),
            devices=st.lists(device, max_size=3),
        )
    return None


def _requests(method_desc, pools: dict[str, list[str]]) -> st.SearchStrategy[bytes]:  # type: ignore[no-untyped-def]
    """Serialized requests: structured messages (SubmitJob with fuzzed YAML), or raw bytes."""
    structured = messages(method_desc.input_type, pools)
    shaped = _shaped(method_desc.name, pools)
    if shaped is not None:
        structured = st.one_of(structured, shaped, shaped)  # type: ignore[arg-type]
    if method_desc.name == "SubmitJob":

        def with_spec(pair: tuple[pb.SubmitJobRequest, str]) -> pb.SubmitJobRequest:
            request, spec = pair
            request.spec_yaml = spec
            return request

        structured = st.tuples(structured, job_specs()).map(with_spec)
    return st.one_of(
        structured.map(lambda m: m.SerializeToString()),
        structured.map(lambda m: m.SerializeToString()),
        st.binary(max_size=200),
    )


def _fuzz(
    channel: grpc.Channel,
    service: str,
    method_desc,  # type: ignore[no-untyped-def]
    pools: dict[str, list[str]],
    db_path: Path,
    settle: Callable[[], None],
) -> dict[grpc.StatusCode, int]:
    """``settle`` waits until the coordinator's queued writes are committed: an interval
    that moved no plan is answered before its commit, which may land during the next call."""
    seen: dict[grpc.StatusCode, int] = {}

    @FUZZ
    @given(request=_requests(method_desc, pools))
    def run(request: bytes) -> None:
        settle()
        before = database_digest(db_path)
        code = _call(channel, service, method_desc.name, request)
        seen[code] = seen.get(code, 0) + 1
        if code != grpc.StatusCode.OK:
            assert database_digest(db_path) == before, f"{method_desc.name} {code} wrote rows"

    run()
    return seen


UNARY = [m for m in COORDINATOR.methods if not m.server_streaming]


@pytest.mark.parametrize("method", [m.name for m in UNARY])
def test_every_coordinator_rpc_answers_fuzzed_requests_deliberately(
    coordinator, method: str
) -> None:  # type: ignore[no-untyped-def]
    pools = _seed(coordinator)
    desc = COORDINATOR.methods_by_name[method]
    seen = _fuzz(
        coordinator.channel,
        COORDINATOR.full_name,
        desc,
        pools,
        coordinator.db_path,
        coordinator.flush,
    )
    print(method, {c.name: n for c, n in seen.items()})
    assert sum(seen.values()) >= min(EXAMPLES, 10)


def test_watch_cluster_answers_any_request_with_snapshots_or_a_status(coordinator) -> None:  # type: ignore[no-untyped-def]
    pools = _seed(coordinator)
    stub = coordinator_pb2_grpc.CoordinatorStub(coordinator.channel)

    @FUZZ
    @given(request=messages(pb.WatchClusterRequest.DESCRIPTOR, pools))
    def run(request: pb.WatchClusterRequest) -> None:
        stream = stub.WatchCluster(request, timeout=TIMEOUT_S)
        try:
            snapshot = next(stream)
            assert [n.name for n in snapshot.nodes] == ["n1"]
        except grpc.RpcError as exc:
            assert exc.code() in DELIBERATE, f"{exc.code()} {exc.details()}"
        finally:
            stream.cancel()

    run()


@pytest.mark.parametrize("method", [m.name for m in AGENT_LOCAL.methods])
def test_agent_local_answers_fuzzed_requests_deliberately(coordinator, method: str) -> None:  # type: ignore[no-untyped-def]
    pools = _seed(coordinator)
    plans = PlanCache()
    # The forward deadline is the test's, not the agent's 0.4 s: on a loaded two-core runner a
    # forward can take longer, and the agent then answers UNAVAILABLE by design (its fallback
    # has tests of its own); here the question is what it answers the fuzzed request itself.
    service = AgentLocalService(
        coordinator_pb2_grpc.CoordinatorStub(coordinator.channel),
        plans,
        forward_timeout_s=TIMEOUT_S / 2,
    )
    server, port = create_local_server("127.0.0.1:0", service)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            desc = AGENT_LOCAL.methods_by_name[method]
            _fuzz(
                channel, AGENT_LOCAL.full_name, desc, pools, coordinator.db_path, coordinator.flush
            )
    finally:
        server.stop(0).wait()


# ---- the job-spec parser alone ------------------------------------------------------------

SLOTS = [DeviceSlot(f"node{i}", f"n{i}", "127.0.0.1", 0, "cpu", "cpu", 1.0 + i) for i in range(8)]


SMALL_SPEC = "model: debug\nglobal_batch: 8\nsteps: 4\nresources: {ranks: 1}\n"


@pytest.mark.parametrize(
    ("line", "lr"),
    [("lr: 1e-3", 1e-3), ("lr: 5E-2", 5e-2), ("lr: 1.0e-3", 1e-3), ("lr: .5", 0.5), ("lr: 2", 2.0)],
)
def test_floats_as_yaml_1_2_writes_them_are_numbers(line: str, lr: float) -> None:
    """Issue 17: ``lr: 1e-3`` was the string "1e-3" (YAML 1.1 wants a dot) and refused."""
    spec = parse_jobspec(f"name: f\n{line}\n{SMALL_SPEC}", source="f.yaml")
    assert spec.options.lr == pytest.approx(lr)
    assert parse_jobspec(f"name: i\nseed: 12\n{SMALL_SPEC}").seed == 12  # ints stay ints


@pytest.mark.parametrize("name", ['"evil\\n"', '"evil\\nname"', '"a\\tb"', '"ok "'])
def test_a_name_with_a_control_character_or_trailing_space_is_refused(name: str) -> None:
    """The whole name must match (``fullmatch``): a trailing newline is not allowed by ``$``."""
    with pytest.raises(ConfigError, match=r"^n.yaml:1: name: must be 1-64 letters") as err:
        parse_jobspec(f"name: {name}\n{SMALL_SPEC}", source="n.yaml")
    assert "\n" not in str(err.value)


@settings(max_examples=SPEC_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=job_specs())
def test_any_spec_text_parses_or_fails_with_one_line_naming_the_source(text: str) -> None:
    try:
        spec = parse_jobspec(text, source="fuzz.yaml", allowed_roots=("/tmp",))
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("fuzz.yaml") and "\n" not in message and len(message) <= 500
        return
    # Accepted: every value fits the wire messages that carry it to agents.
    pb.TrainingArgs(command=list(spec.command), options=spec.launch_options())
    try:
        placed = place(spec, SLOTS, 29500)
    except HeteroError:
        return  # cannot be placed on 8 CPU devices: a deliberate error
    dry_run_job(spec, text, placed)
    for p in predict(spec, placed):
        prediction_message(p)
