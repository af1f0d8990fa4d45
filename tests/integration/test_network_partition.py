"""Network partition: two hosts made with network namespaces, one link cut and healed.

The coordinator runs in this (root) namespace on a bridge address; each agent
runs in its own namespace behind a veth pair on that bridge, with its own
address, so a two-rank job spans two "hosts" and its rendezvous
(``MASTER_ADDR``) is a bridge address, not loopback. Cutting one host's link
(``ip link set ... down`` on the bridge side) must be seen as that node
failing, must not leave the surviving rank blocked in a collective, and the
node must come back healthy when the link heals.

Needs root (or CAP_NET_ADMIN) for ``ip netns``; skipped with the reason
otherwise. Marked ``chaos``: run with ``make chaos``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from hetero.core.jobspec import JobSpec
from hetero.security.auth import new_token
from hetero.security.transport import ClientSecurity, client_channel
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

#: Heartbeat settings of the coordinator under test, seconds: short, so a cut is seen fast.
HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 3.0
#: Seconds a rank's collective waits for a dead peer before failing (the no-hang bound).
COLLECTIVE_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 5.0
FINISHED = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str
    netns: str
    #: Bridge side of the host's veth pair: setting it down cuts the host off.
    link: str
    address: str

    def argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class Network:
    """A bridge in the root namespace and hosts behind it, each in its own namespace."""

    tag: str
    bridge: str
    gateway: str
    hosts: dict[str, Host] = field(default_factory=dict)

    def cut(self, host: str) -> None:
        _must("link", "set", self.hosts[host].link, "down")

    def heal(self, host: str) -> None:
        _must("link", "set", self.hosts[host].link, "up")

    def remove(self) -> None:
        # Deleting a namespace deletes its end of each veth pair, and with it the pair.
        for h in self.hosts.values():
            _ip("netns", "delete", h.netns)
            _ip("link", "delete", h.link)
        _ip("link", "delete", self.bridge)


def _netns_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"hetero-probe-{uuid.uuid4().hex[:8]}"
    done = _ip("netns", "add", probe)
    if done.returncode != 0:
        return f"cannot create network namespaces (needs root/CAP_NET_ADMIN): {done.stderr.strip()}"
    _ip("netns", "delete", probe)
    return None


@pytest.fixture
def network() -> Iterator[Network]:
    """Bridge ``hb<tag>`` at 10.231.N.1/24, hosts ``a`` and ``b`` at .2 and .3 (unique names
    per test, so parallel runs do not collide); everything is removed afterwards."""
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:6]
    subnet = ipaddress.ip_network(f"10.231.{int(tag[:2], 16)}.0/24")
    gateway = str(subnet.network_address + 1)
    net = Network(tag, f"hb{tag}", gateway)
    try:
        _must("link", "add", net.bridge, "type", "bridge")
        _must("addr", "add", f"{gateway}/24", "dev", net.bridge)
        _must("link", "set", net.bridge, "up")
        for i, name in enumerate(("a", "b")):
            host = Host(
                name=f"part-{name}",
                netns=f"hetero-{tag}-{name}",
                link=f"hv{tag}{name}",
                address=str(subnet.network_address + 2 + i),
            )
            net.hosts[name] = host
            _must("netns", "add", host.netns)
            _must(
                "link",
                "add",
                host.link,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            )
            _must("link", "set", host.link, "master", net.bridge)
            _must("link", "set", host.link, "up")
            _must("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _must("-n", host.netns, "link", "set", "eth0", "up")
            _must("-n", host.netns, "link", "set", "lo", "up")
        yield net
    finally:
        net.remove()


@dataclass
class Daemons:
    """The coordinator and the agents as processes; everything is stopped at the end."""

    root: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            start_new_session=True,
        )
        log.close()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.root.glob("*.log"))
        )


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path)
    try:
        yield d
    finally:
        d.stop()


def _wait(what: str, predicate: Callable[[], bool], timeout_s: float, d: Daemons) -> float:
    """Seconds until ``predicate()`` held; fails with the daemons' logs after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s:g} s\n{d.logs()}")


def _job_yaml(steps: int) -> str:
    spec = f"""\
name: partition
model: debug
global_batch: 16
steps: {steps}
policy: equal
rebalance_interval: 5
resources:
  ranks: 2
  device: cpu
  nodes: [part-a, part-b]
"""
    # Where the job spec carries the collective timeout, the coordinator sets it for
    # the ranks (and overrides the agents' environment): give it there too.
    if "collective_timeout_s" in {f.name for f in dataclasses.fields(JobSpec)}:
        spec += f"collective_timeout_s: {COLLECTIVE_TIMEOUT_S:g}\n"
    return spec


def _start_cluster(net: Network, d: Daemons) -> pb_grpc.CoordinatorStub:
    """Coordinator on the bridge, an agent per host; all calls carry a token (a
    coordinator on a non-loopback address refuses to run without authentication)."""
    port = 7000 + int(net.tag[2:5], 16) % 2000
    address = f"{net.gateway}:{port}"
    token = new_token()
    token_file = d.root / "token"
    token_file.write_text(token.reveal())
    token_file.chmod(0o600)
    config = d.root / "coordinator.yaml"
    config.write_text(
        f"heartbeat_interval_s: {HEARTBEAT_INTERVAL_S}\n"
        f"heartbeat_timeout_s: {HEARTBEAT_TIMEOUT_S}\ngrace_s: 1\n"
        # Checkpoints of the restart test live in a folder of the test's directory
        # (not the one that holds the daemons' state directories).
        f"allowed_roots: [{d.root / 'job-files'}]\n"
    )
    d.spawn(
        "coordinator",
        [
            *(sys.executable, "-m", "hetero.coordinator.cli", "serve", "--config", str(config)),
            *("--listen", address, "--state-dir", str(d.root / "coordinator")),
            *("--token-file", str(token_file)),
        ],
    )
    for key in ("a", "b"):
        host = net.hosts[key]
        argv = [sys.executable, "-m", "hetero.agent.cli", "run", "--coordinator", address]
        argv += ["--name", host.name, "--state-dir", str(d.root / host.name), "--quick"]
        argv += ["--cpu-threads", "1", "--stop-grace", "3", "--local-listen", "127.0.0.1:0"]
        argv += ["--token-file", str(token_file), "--allow-root"]  # the test runs as root
        # The agent's environment reaches the ranks it launches.
        env = {"HETERO_COLLECTIVE_TIMEOUT_S": f"{COLLECTIVE_TIMEOUT_S:g}"}
        d.spawn(host.name, host.argv(*argv), env)
    channel = client_channel(address, ClientSecurity(token=token))
    stub = pb_grpc.CoordinatorStub(channel)
    _wait(
        "both agents registered and healthy", lambda: _healthy(stub) == {"part-a", "part-b"}, 90, d
    )
    return stub


def _nodes(stub: pb_grpc.CoordinatorStub) -> dict[str, pb.Node]:
    try:
        resp = stub.ListNodes(pb.ListNodesRequest(), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError:
        return {}
    return {n.name: n for n in resp.nodes}


def _healthy(stub: pb_grpc.CoordinatorStub) -> set[str]:
    return {name for name, n in _nodes(stub).items() if n.healthy}


def _job(stub: pb_grpc.CoordinatorStub, job_id: str) -> pb.Job:
    return stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)


def test_cut_link_is_a_node_failure_no_rank_hangs_and_the_node_rejoins(
    network: Network, daemons: Daemons
) -> None:
    stub = _start_cluster(network, daemons)
    nodes = _nodes(stub)
    assert nodes["part-a"].address == network.hosts["a"].address
    assert nodes["part-b"].address == network.hosts["b"].address

    # A job with a rank on each host trains: its process group met at a bridge address.
    submitted = stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=_job_yaml(steps=1_000_000)), timeout=CALL_TIMEOUT_S
    )
    job_id = submitted.job_id
    assert {r.node_name for r in submitted.job.ranks} == {"part-a", "part-b"}
    master = submitted.job.master_addr
    assert master == network.hosts["a"].address, f"rendezvous on {master}"
    _wait(
        "the two-host job trains (interval reports arrive)",
        lambda: _job(stub, job_id).last_step >= 10,
        120,
        daemons,
    )

    # Cut host b off: the coordinator sees a node failure after its heartbeat timeout.
    network.cut("b")
    detect_s = _wait(
        "part-b marked unhealthy",
        lambda: "part-b" not in _healthy(stub),
        HEARTBEAT_TIMEOUT_S + 10,
        daemons,
    )
    assert "part-a" in _healthy(stub), "the host that kept its link stays healthy"

    # The rank on host a is not left in a collective with a peer that never answers:
    # within the collective timeout the job stops waiting (it fails, or it restarts).
    def moved_on() -> bool:
        job = _job(stub, job_id)
        return job.state in FINISHED or job.restarts > 0

    unstuck_s = detect_s + _wait(
        "the job stops waiting for the lost rank", moved_on, COLLECTIVE_TIMEOUT_S + 30, daemons
    )
    job = _job(stub, job_id)

    # Heal: host b heartbeats again and is healthy.
    network.heal("b")
    rejoin_s = _wait("part-b healthy again", lambda: "part-b" in _healthy(stub), 60, daemons)
    print(
        f"\npartition figures: node failure detected {detect_s:.1f} s after the cut "
        f"(heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s, interval {HEARTBEAT_INTERVAL_S:g} s); "
        f"the job stopped waiting {unstuck_s:.1f} s after the cut (collective timeout "
        f"{COLLECTIVE_TIMEOUT_S:g} s): {pb.JobState.Name(job.state)}, restarts {job.restarts}, "
        f"{job.message!r}; part-b healthy {rejoin_s:.1f} s after the heal"
    )


def test_after_a_cut_the_job_restarts_on_the_surviving_host_and_completes(
    network: Network, daemons: Daemons, tmp_path: Path
) -> None:
    """RESTART ASSERTION: with restarts on node loss, the job resumes from its checkpoint
    on the host that kept its link and completes; the healed host is healthy again."""
    stub = _start_cluster(network, daemons)
    spec = _job_yaml(steps=400) + (
        f"max_restarts: 2\ncheckpoint:\n  dir: {tmp_path / 'job-files' / 'ckpt'}\n  interval_steps: 20\n"
    )
    job_id = stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=CALL_TIMEOUT_S).job_id
    _wait("the two-host job trains", lambda: _job(stub, job_id).last_step >= 40, 120, daemons)
    network.cut("b")
    _wait("part-b marked unhealthy", lambda: "part-b" not in _healthy(stub), 15, daemons)
    _wait(
        "the job finishes on part-a",
        lambda: _job(stub, job_id).state in FINISHED,
        COLLECTIVE_TIMEOUT_S + 240,
        daemons,
    )
    job = _job(stub, job_id)
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.message
    assert job.restarts >= 1
    assert {r.node_name for r in job.ranks} == {"part-a"}
    network.heal("b")
    _wait("part-b healthy again", lambda: "part-b" in _healthy(stub), 60, daemons)
