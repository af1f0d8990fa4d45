"""Trainer -> agent -> coordinator over real gRPC, and what happens when a hop is down.

The coordinator is the real server on port 0 with SQLite under tmp_path (the
``coordinator`` fixture); the agent side is the real ``AgentLocal`` server; the
trainer side is the real ``AgentPlanner``. A trainer whose agent is gone runs as
real Gloo ranks through ``hetero-train``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from hetero.agent.local import AgentLocalService, PlanCache, create_local_server
from hetero.agent.supervisor import Supervisor
from hetero.coordinator import store
from hetero.coordinator.database import session_factory
from hetero.coordinator.reports import HISTORY
from hetero.coordinator.server import Settings, create_server
from hetero.core.balancer import Constraints, RankInterval, make_policy
from hetero.trainer.control import AgentPlanner
from hetero.trainer.exchange import EmbeddedPlanner, RankSummary
from hetero.trainer.launch import free_port
from hetero.v1 import agent_pb2_grpc, coordinator_pb2_grpc
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
#: The planner's deadline toward a hung agent (s): the test waits it out twice.
HUNG_DEADLINE_S = 2.0
JOB = """\
name: ctl
model: debug
global_batch: 48
steps: 100
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 2
  device: cpu
"""


def _summary(rank: int, batch: int, per_sample_s: float) -> RankSummary:
    compute = per_sample_s * batch + 0.001
    return RankSummary(
        rank,
        batch,
        9,
        compute,
        compute + 0.002,
        0.0,
        0.0,
        0.0,
        0.001,
        0.0,
        0.0,
        1.0,
        9 * batch,
        0,
        1.0,
    )


@pytest.fixture
def agent_local(coordinator) -> Iterator[tuple[str, grpc.Server, PlanCache]]:  # type: ignore[no-untyped-def]
    plans = PlanCache()
    stub = coordinator_pb2_grpc.CoordinatorStub(coordinator.channel)
    # The test's deadline for forwards, not the agent's 0.4 s: a loaded runner forwards slowly.
    service = AgentLocalService(stub, plans, forward_timeout_s=DEADLINE_S)
    server, port = create_local_server("127.0.0.1:0", service)
    server.start()
    try:
        yield f"127.0.0.1:{port}", server, plans
    finally:
        server.stop(0).wait()


def _submit(coordinator) -> str:  # type: ignore[no-untyped-def]
    for name in ("n1", "n2"):
        coordinator.stub.RegisterNode(
            pb.RegisterNodeRequest(
                name=name,
                address="127.0.0.1",
                devices=[tpb.DeviceProfile(index=0, kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)],
            ),
            timeout=DEADLINE_S,
        )
    resp = coordinator.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=JOB), timeout=DEADLINE_S)
    return str(resp.job_id)


def test_planner_reports_in_the_background_and_adopts_the_answer_one_boundary_later(
    coordinator, agent_local
) -> None:  # type: ignore[no-untyped-def]
    endpoint, _, plans = agent_local
    job_id = _submit(coordinator)
    cons = Constraints(48, 2, 1)
    step = [10]
    summaries = [[_summary(0, 24, 0.001), _summary(1, 24, 0.003)]]
    planner = AgentPlanner(
        endpoint,
        job_id,
        EmbeddedPlanner(make_policy("dynamic"), cons),
        cons,
        lambda: (step[0], summaries[0]),
        plan_version=1,
        deadline_s=DEADLINE_S,
    )
    history = (tuple(s.to_interval() for s in summaries[0]),)

    # Boundary 10: the report goes out; rank 0 does not wait for the answer.
    first = planner.decide(history, (24, 24))
    assert not first.changed and "not in yet" in first.reason
    assert planner.flush(), "the report was answered"
    newest = coordinator.stub.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S)
    assert newest.version == 2, "the coordinator re-planned from the step-10 report"
    assert planner.seen_version == 1, "nothing is adopted between boundaries"

    # Boundary 20 (the interval still ran v1): the step-10 answer is adopted now.
    step[0] = 20
    decision = planner.decide(history, (24, 24))
    assert decision.changed and decision.reason.startswith("coordinator plan v2")
    assert decision.batches[1] < decision.batches[0] and sum(decision.batches) == 48
    assert planner.seen_version == 2 and plans.get(job_id).version == 2  # type: ignore[union-attr]
    assert planner.flush()

    # Boundary 30, after an interval on v2: its answer is current, nothing changes.
    step[0] = 30
    summaries[0] = [
        _summary(0, decision.batches[0], 0.001),
        _summary(1, decision.batches[1], 0.003),
    ]
    again = planner.decide(history, tuple(decision.batches))
    assert not again.changed and again.reason == "coordinator plan v2 is current"
    planner.close()  # delivers the step-30 report still in flight

    detail = coordinator.stub.GetJobDetail(
        pb.GetJobDetailRequest(job_id=job_id), timeout=DEADLINE_S
    )
    ran = [(iv.end_step, iv.plan_version) for iv in detail.intervals]
    assert ran == [(10, 1), (20, 1), (30, 2)], "each interval is stored with the plan it ran"
    assert [p.version for p in detail.plans] == [1, 2], (
        "the step-20 interval ran v1 after v2 existed: stored, not re-planned into a duplicate"
    )
    stats = planner.stats()
    assert stats["calls"] == 3 and stats["failures"] == 0 and stats["skipped"] == 0


def test_what_a_trainer_measures_reaches_the_history_the_coordinator_plans_from(
    tmp_path: Path,
) -> None:
    """A plan change's cost, the steps' spread and the input rate go trainer -> agent ->
    coordinator, are stored, and are in the balancer's history: the coordinator's in
    memory, and the one a restarted coordinator loads."""
    server, port = create_server("127.0.0.1:0", Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}"))
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    service = AgentLocalService(stub, PlanCache(), forward_timeout_s=DEADLINE_S)
    local_server, local_port = create_local_server("127.0.0.1:0", service)
    local_server.start()
    measured = [
        replace(_summary(0, 24, 0.001), switch_s=0.02, busy_cv=0.05, input_s=0.011, input_cv=0.3),
        replace(_summary(1, 24, 0.003), busy_cv=0.04),  # nothing to switch, no workers
    ]
    want = [(0.02, 0.05, 0.011, 0.3), (None, 0.04, None, None)]
    step = [10]
    cons = Constraints(48, 2, 1)
    job_id = _submit(SimpleNamespace(stub=stub))
    planner = AgentPlanner(
        f"127.0.0.1:{local_port}",
        job_id,
        EmbeddedPlanner(make_policy("dynamic"), cons),
        cons,
        lambda: (step[0], measured),
        plan_version=1,
        deadline_s=DEADLINE_S,
    )
    try:
        for step[0] in (10, 20):
            planner.decide((tuple(s.to_interval() for s in measured),), (24, 24))
            assert planner.flush()
        held = server.call(lambda: list(server.service.state.jobs[job_id].history))
        measured_of = attrgetter("switch_s", "busy_cv", "input_s", "input_cv")
        assert [[measured_of(r) for r in iv] for _, iv in held] == [want] * 2
        server.flush()  # an interval that moved no plan is answered before its commit
        with session_factory(server.engine)() as s:
            stored = store.interval_history(s, store.get_job(s, job_id), HISTORY)
        assert [[measured_of(r) for r in iv] for iv in stored] == [want] * 2
        detail = stub.GetJobDetail(pb.GetJobDetailRequest(job_id=job_id), timeout=DEADLINE_S)
        fields = ("switch_s", "busy_cv", "input_s", "input_cv")
        shown = [
            [tuple(getattr(r, f) if r.HasField(f) else None for f in fields) for r in iv.ranks]
            for iv in detail.intervals
        ]
        assert shown == [want] * 2
    finally:
        planner.close()
        local_server.stop(0).wait()
        channel.close()
        server.stop(0).wait()


def test_agent_answers_from_its_cache_when_the_coordinator_is_down(tmp_path: Path) -> None:
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    server, port = create_server("127.0.0.1:0", deps)
    server.start()
    to_coordinator = grpc.insecure_channel(f"127.0.0.1:{port}")
    coordinator = SimpleNamespace(stub=coordinator_pb2_grpc.CoordinatorStub(to_coordinator))
    plans = PlanCache()
    local_server, local_port = create_local_server(
        "127.0.0.1:0", AgentLocalService(coordinator.stub, plans)
    )
    local_server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{local_port}")
    try:
        job_id = _submit(coordinator)
        local = agent_pb2_grpc.AgentLocalStub(channel)
        first = local.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S)
        assert first.version == 1
        server.stop(0).wait()  # the coordinator goes down
        # Answered within the caller's deadline, from the cache: an agent that waited for
        # the coordinator past it would fail this call. (No wall-clock bound of its own: a
        # loaded host makes a loopback call slow without the agent waiting on anything.)
        cached = local.GetPlan(tpb.GetPlanRequest(job_id=job_id), timeout=DEADLINE_S)
        assert cached == first
        with pytest.raises(grpc.RpcError) as info:
            local.GetPlan(tpb.GetPlanRequest(job_id="unknown"), timeout=DEADLINE_S)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()
        local_server.stop(0).wait()
        to_coordinator.close()
        server.stop(0).wait()


@pytest.fixture
def silent_agent() -> Iterator[str]:
    """An endpoint that accepts TCP connections and never answers: a hung agent."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_planner_never_waits_for_a_hung_agent_and_falls_back_when_its_deadline_passes(
    silent_agent: str,
) -> None:
    cons = Constraints(48, 2, 1)
    now = [100.0]
    history = tuple(
        (RankInterval(0, 24, 9, 0.025, 0.08), RankInterval(1, 24, 9, 0.073, 0.08)) for _ in range(3)
    )
    planner = AgentPlanner(
        silent_agent,
        "job",
        EmbeddedPlanner(make_policy("dynamic"), cons),
        cons,
        lambda: (30, None),
        # Long enough that the request is still out at the next two lines on a loaded
        # host (a stall past the deadline would end it before the test looks).
        deadline_s=HUNG_DEADLINE_S,
        clock=lambda: now[0],
    )
    first = planner.decide(history, (24, 24))
    assert not first.changed, "no answer yet: the plan is kept"
    assert not planner.flush(0), "decide returned while the request was still out"
    second = planner.decide(history, (24, 24))
    assert not second.changed and planner.skipped == 1, (
        "at most one request in flight: this boundary sends nothing"
    )
    assert planner.flush(10 * HUNG_DEADLINE_S), "the deadline ends the request"
    fallback = planner.decide(history, (24, 24))
    assert fallback.changed and fallback.batches[0] > fallback.batches[1], (
        "the embedded policy answered"
    )
    assert planner.failures == 1 and planner.retry_at == 101.0
    planner.decide(history, (24, 24))
    assert planner.flush(0) and planner.stats()["calls"] == 0, "within the backoff nothing is sent"
    now[0] = 102.0
    assert not planner.decide(history, (24, 24)).changed, "asks again after the backoff"
    assert planner.flush(10 * HUNG_DEADLINE_S)
    planner.decide(history, (24, 24))
    assert planner.failures == 2 and planner.retry_at == 104.0, "the backoff doubles"
    planner.close()


@pytest.mark.slow
def test_trainer_whose_agent_is_down_keeps_training_on_the_embedded_policy(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        HETERO_AGENT_ENDPOINT=f"127.0.0.1:{free_port()}",
        HETERO_JOB_ID="lost-agent",
        HETERO_PLAN="1:24,24",
        PYTHONUNBUFFERED="1",
    )
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.trainer.cli",
            "--nproc",
            "2",
            "--model",
            "debug",
            "--num-samples",
            "960",
            "--global-batch",
            "48",
            "--steps",
            "40",
            "--rebalance-interval",
            "5",
            "--emulate-slowdown",
            "1:6",
            "--ideal-steps",
            "0",
            "--summary-json",
            str(out / "summary.json"),
            "--output-dir",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "using the embedded policy" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 40
    # From the second boundary on, the embedded policy decides from the ranks' measurements
    # (a move names the step time it predicts, a hold why it holds); none waits on the
    # dead agent. Whether it moves within 40 steps depends on how noisy the host is (a
    # loaded one rightly finds that a move does not pay back), so that is not asserted.
    records = [json.loads(line) for line in (out / "metrics" / "rank0.jsonl").open()]
    assert len(records) == 8
    reasons = [r["reason"] for r in records]
    assert all(r and "answer not in yet" not in r for r in reasons[1:]), reasons
    assert any("predicted" in r or "does not pay back" in r for r in reasons[1:]), reasons


def test_supervisor_escalates_to_sigkill_and_captures_output(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    stubborn = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); print('oops', file=sys.stderr, flush=True); time.sleep(60)"
    )
    sup.launch("j", 0, [sys.executable, "-c", stubborn], dict(os.environ), tmp_path / "w")
    deadline = time.monotonic() + 20
    lines = []
    while len(lines) < 2 and time.monotonic() < deadline:
        lines += sup.take_lines()
        time.sleep(0.05)
    assert {(x.stream, x.text) for x in lines} == {("stdout", "ready"), ("stderr", "oops")}
    assert sup.stop("j", 0, grace_s=0.3)
    exits = []
    while not exits and time.monotonic() < deadline:
        exits = sup.poll()
        time.sleep(0.05)
    assert exits and exits[0].code == 128 + signal.SIGKILL and exits[0].stopped
    assert "ready" in (tmp_path / "jobs" / "j" / "rank0.log").read_text()


def test_supervisor_starts_a_rank_without_forking_the_agent_and_it_dies_with_the_agent(
    tmp_path: Path,
) -> None:
    """The agent is a threaded gRPC process: forking it whole runs gRPC's at-fork handlers
    in the child, which aborted a rank now and then before its program began. A launch
    runs no at-fork handler of the agent's, the rank's program still gets the death signal
    and Python's ignored SIGPIPE is not passed on; a program that is not there is refused
    at launch, naming it."""
    forks: list[int] = []
    os.register_at_fork(before=lambda: forks.append(os.getpid()))
    sup = Supervisor(tmp_path)
    show = "grep -E '^(SigIgn|PPid):' /proc/$$/status"
    sup.launch("j", 0, ["sh", "-c", show], dict(os.environ), tmp_path / "w")
    deathsig = (
        "import ctypes; v = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(v)); print('deathsig', v.value)"
    )
    sup.launch("j", 1, [sys.executable, "-c", deathsig], dict(os.environ), tmp_path / "w")
    deadline = time.monotonic() + 20
    exits: list = []
    while len(exits) < 2 and time.monotonic() < deadline:
        exits += sup.poll()
        time.sleep(0.05)
    assert sorted(x.code for x in exits) == [0, 0]
    assert forks == [], "launching a rank forked the agent's process"
    log = (tmp_path / "jobs" / "j" / "rank0.log").read_text()
    ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", log).group(1), 16)  # type: ignore[union-attr]
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # what Python ignores for itself
        assert not ignored & 1 << (sig - 1), f"{sig.name} is ignored in the rank: {log}"
    assert f"PPid:\t{os.getpid()}" in log, log
    log = (tmp_path / "jobs" / "j" / "rank1.log").read_text()
    assert f"deathsig {int(signal.SIGKILL)}" in log, log
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        sup.launch("j", 2, ["no-such-program"], dict(os.environ), tmp_path / "w")
