"""A whole hetero cluster on this machine: a coordinator and agents as real processes.

For ``make demo``, the control-plane benchmark and the end-to-end tests. Each
daemon is started exactly as an operator would start it (``hetero-coord serve``,
``hetero-agent run``) on loopback ports, with its own state directory; ``stop()``
sends SIGTERM, waits, then SIGKILLs whatever is left, so nothing outlives the
cluster.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import grpc

from hetero.core import defaults
from hetero.core.errors import HeteroError
from hetero.core.states import job_label, job_terminal
from hetero.security.auth import ensure_token, load_token, local_token_path, scrub_environment
from hetero.security.permissions import private_dir
from hetero.security.transport import ClientSecurity, client_channel, remote_error
from hetero.trainer.launch import free_port
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

#: Seconds each RPC to the local coordinator may take.
CALL_TIMEOUT_S = 5.0


class ClusterError(HeteroError):
    """The local cluster did not come up, or a job in it did not finish in time."""


@dataclass(frozen=True)
class AgentSpec:
    name: str
    emulate_slowdown: float = 1.0
    cpu_threads: int = 1
    #: ``--watchdog`` seconds (None: the agent's default).
    watchdog_s: float | None = None


@dataclass
class LocalCluster:
    """``with LocalCluster(root, agents) as c: c.submit(yaml)``; daemons' logs under ``root``."""

    root: Path
    agents: Sequence[AgentSpec]
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    heartbeat_interval_s: float = defaults.HEARTBEAT_INTERVAL_S
    python: str = sys.executable
    #: Token file every daemon and this client use; None = the token the coordinator
    #: generates in its state directory (its secure default), handed to the agents.
    token_file: Path | None = None
    #: Each agent presents its own node's credential (``hetero-coord node-token``), not
    #: the cluster's token: it may then act only for its own node.
    node_credentials: bool = False
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    address: str = ""
    _logs: list[IO[bytes]] = field(default_factory=list)
    _channel: grpc.Channel | None = None

    @property
    def job_files(self) -> Path:
        """The cluster's allowed root: where its jobs' checkpoints and data go (beside the
        daemons' state directories, never holding one)."""
        return self.root / "job-files"

    @property
    def token_path(self) -> Path:
        """The token clients of this cluster present (``hetero-coord --token-file``)."""
        return self.token_file or local_token_path(self.root / "coordinator")

    @property
    def stub(self) -> pb_grpc.CoordinatorStub:
        if self._channel is None:
            self._ensure_token()
            security = ClientSecurity(load_token(self.token_path))
            self._channel = client_channel(self.address, security)
        return pb_grpc.CoordinatorStub(self._channel)  # type: ignore[no-untyped-call, unused-ignore]

    def _ensure_token(self) -> None:
        """The coordinator's generated token, made here first if an agent starts before
        the coordinator (which then finds and keeps it in its state directory)."""
        if self.token_file is None:
            ensure_token(local_token_path(private_dir(self.root / "coordinator")))

    def _spawn(
        self, name: str, argv: list[str], token: bool = True, token_path: Path | None = None
    ) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = (self.root / f"{name}.log").open("ab")  # a restarted daemon appends
        self._logs.append(log)
        # Credentials only as given here: none inherited from the caller's environment.
        env = dict(scrub_environment(os.environ), PYTHONUNBUFFERED="1")
        if token:
            argv = [*argv, "--token-file", str(token_path or self.token_path)]
        self.procs[name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )

    def start_coordinator(self, port: int | None = None) -> None:
        port = port or free_port()
        self.address = f"127.0.0.1:{port}"
        config = self.root / "coordinator.yaml"
        self.root.mkdir(parents=True, exist_ok=True)
        if not config.exists():  # a restarted coordinator keeps its rendezvous ports
            # Clusters of concurrent test runs on one host must not share rendezvous ports.
            config.write_text(
                f"heartbeat_timeout_s: {self.heartbeat_timeout_s}\n"
                f"heartbeat_interval_s: {self.heartbeat_interval_s}\ngrace_s: 1\n"
                f"master_port_base: {random.randrange(20000, 40000, 100)}\n"
                # Jobs' checkpoints and data live in a folder of their own.
                f"allowed_roots: [{json.dumps(str(self.job_files))}]\n"
            )
        argv = [self.python, "-m", "hetero.coordinator.cli", "serve", "--config", str(config)]
        argv += ["--listen", self.address, "--state-dir", str(self.root / "coordinator")]
        self._spawn("coordinator", argv, token=self.token_file is not None)

    def start_agent(self, spec: AgentSpec) -> None:
        argv = [self.python, "-m", "hetero.agent.cli", "run", "--coordinator", self.address]
        argv += ["--name", spec.name, "--address", "127.0.0.1", "--local-listen", "127.0.0.1:0"]
        argv += ["--state-dir", str(self.root / spec.name), "--quick"]
        argv += ["--cpu-threads", str(spec.cpu_threads), "--stop-grace", "3"]
        if spec.emulate_slowdown != 1.0:
            argv += ["--emulate-slowdown", f"{spec.emulate_slowdown:g}"]
        if spec.watchdog_s is not None:
            argv += ["--watchdog", f"{spec.watchdog_s:g}"]
        if os.geteuid() == 0:  # the cluster runs as whoever started it, root included
            argv += ["--allow-root"]
        self._ensure_token()
        self._spawn(spec.name, argv, token_path=self._node_credential(spec.name))

    def _node_credential(self, name: str) -> Path | None:
        """Node ``name``'s credential, made with ``hetero-coord node-token`` as an operator
        would (None: the agents use the cluster's token)."""
        if not self.node_credentials:
            return None
        path = self.root / f"{name}.token"
        argv = [self.python, "-m", "hetero.coordinator.cli", "node-token", name]
        argv += ["--state-dir", str(self.root / "coordinator"), "--out", str(path)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ClusterError(f"node-token {name} failed: {done.stderr.strip()}")
        return path

    def kill(self, name: str) -> None:
        """``kill -9`` a daemon (chaos tests): no cleanup of any kind runs."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def restart_coordinator(self) -> None:
        """Start the coordinator again on the same port and database (after ``kill``)."""
        self.start_coordinator(int(self.address.rsplit(":", 1)[1]))

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the coordinator and every agent; return once all nodes are registered.

        Agents start one after another: each profiles its devices before it
        registers, and on one host concurrent profiles would measure each other
        (the compute scores, and so the initial plans, came out random).
        """
        self.start_coordinator()
        for spec in self.agents:
            self.start_agent(spec)
            self.wait_for_nodes({spec.name}, timeout_s)

    def wait_for_nodes(self, names: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                nodes = self.stub.ListNodes(pb.ListNodesRequest(), timeout=CALL_TIMEOUT_S).nodes
                if names <= {n.name for n in nodes if n.healthy}:
                    return
            except grpc.RpcError:
                pass  # the coordinator is still starting
            time.sleep(0.2)
        raise ClusterError(f"nodes {sorted(names)} did not register within {timeout_s:.0f} s")

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.returncode == -signal.SIGKILL:
                continue  # killed on purpose
            if proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with {proc.returncode}; see {self.root / name}.log"
                )

    def submit(self, spec_yaml: str, source: str = "job.yaml") -> str:
        req = pb.SubmitJobRequest(spec_yaml=spec_yaml, source_name=source)
        try:
            return str(self.stub.SubmitJob(req, timeout=CALL_TIMEOUT_S).job_id)
        except grpc.RpcError as exc:
            raise ClusterError(f"submit failed: {remote_error(exc, 'the coordinator')}") from None

    def wait(
        self,
        job_id: str,
        timeout_s: float,
        on_poll: Callable[[pb.Job], None] | None = None,
        period_s: float = 0.5,
    ) -> pb.Job:
        """Poll the job until it finishes; ``on_poll`` sees every snapshot."""
        deadline = time.monotonic() + timeout_s
        while True:
            job: pb.Job = self.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)
            if on_poll is not None:
                on_poll(job)
            if job_terminal(job.state):
                return job
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"job {job_id} still {job_label(job.state)} after {timeout_s:.0f} s"
                )
            self._check_alive()
            time.sleep(period_s)

    def logs(self, job_id: str) -> list[pb.LogLine]:
        lines: list[pb.LogLine] = []
        after = 0
        while True:
            resp = self.stub.GetJobLogs(
                pb.GetJobLogsRequest(job_id=job_id, after_seq=after), timeout=CALL_TIMEOUT_S
            )
            lines.extend(resp.lines)
            if not resp.lines:
                return lines
            after = resp.next_seq

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM every daemon (agents first, so they stop their ranks), then SIGKILL."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        order = [n for n in self.procs if n != "coordinator"] + ["coordinator"]
        for name in order:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name in order:
            proc = self.procs.get(name)
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
