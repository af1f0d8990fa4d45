"""Attacks by another user of the coordinator's host (issue 17, items 1 and 10).

Before the fix, ``hetero-coord serve`` with no token listened on loopback
unauthenticated: any local user submitted a ``command:`` job with plain HTTP/2
(curl), run as the agent's user (root, when the agent ran as root); the state
directory was 0755 and the database 0644. Now the coordinator generates a token
into its state directory (0600) and sets its own umask (0027); clients of the
same user read the token from there. The daemons run here as real processes;
the cases with a second user run the attacker as ``nobody`` and need root.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from conftest import hand_clocked, start_coordinator
from handclock import Clock

from hetero.agent.config import AgentConfig
from hetero.agent.daemon import Agent
from hetero.agent.profile import DeviceMeasure, NodeProfile
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

NOBODY = 65534
#: The coordinator's user: root's state directory is /var/lib/hetero whatever XDG says,
#: so a root test run serves as ``nobody``, whose default state directory is under XDG.
OWNER = NOBODY if os.geteuid() == 0 else None
#: Generous: the first call of a fresh daemon on a loaded two-core runner can take seconds.
DEADLINE_S = 30.0
COMMAND_JOB = """\
name: evil
command: ["/bin/sh", "-c", "id > /tmp/pwned"]
global_batch: 8
steps: 1
resources:
  ranks: 1
  device: cpu
"""
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second local user needs root")


def _env(state_home: Path) -> dict[str, str]:
    """A clean environment: no credential variables; XDG state under ``state_home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETERO_", "CREDENTIALS_"))}
    return {
        **env,
        "XDG_STATE_HOME": str(state_home),
        "HOME": str(state_home),
        "PYTHONFAULTHANDLER": "1",  # a hung daemon's stacks on SIGABRT (see _stop)
    }


def _argv(uid: int | None, *argv: str) -> list[str]:
    """``argv`` run as ``uid`` (None: this user); ``setpriv`` drops every capability."""
    if uid is None:
        return list(argv)
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]


@dataclass
class Daemon:
    address: str
    state_dir: Path
    log: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture
def root_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is 0700 to root), so that only
    the coordinator's own modes keep other users out."""
    path = Path(tempfile.mkdtemp(prefix="hetero-adv-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False)


def _serve(root: Path, *extra: str) -> Daemon:
    """``hetero-coord serve`` with its defaults as :data:`OWNER`: its state directory is
    that user's default, under ``root``."""
    home = root / "home"
    home.mkdir(exist_ok=True)
    if OWNER is not None:
        os.chown(home, OWNER, OWNER)
    log = root / "coordinator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            _argv(
                OWNER,
                sys.executable,
                "-m",
                "hetero.coordinator.cli",
                "serve",
                "--listen",
                "127.0.0.1:0",  # the port it bound is in its log: no race for a free one
                *extra,
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(home),
        )
    deadline = time.monotonic() + 60
    while (bound := re.search(r"listening on \S+ \(port (\d+)", log.read_text())) is None:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return Daemon(f"127.0.0.1:{bound.group(1)}", home / "hetero", log, proc)


def _stop(daemon: Daemon) -> None:
    """SIGTERM, as systemd stops it. A daemon still running after 30 s fails the test
    with its log, and the stacks of its threads in it (faulthandler, on SIGABRT)."""
    daemon.proc.terminate()
    try:
        daemon.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.proc.send_signal(signal.SIGABRT)
        try:
            daemon.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait()
        raise AssertionError(
            "hetero-coord serve still ran 30 s after SIGTERM:\n" + daemon.log.read_text()[-6000:]
        ) from None


def _cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """``hetero-coord ARGS`` as the coordinator's user, with no token given."""
    return subprocess.run(
        _argv(
            OWNER,
            sys.executable,
            "-m",
            "hetero.coordinator.cli",
            *args,
            "--coordinator",
            daemon.address,
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(daemon.state_dir.parent),
    )


def _bare_submit(address: str) -> grpc.RpcError:
    """What ``curl --http2-prior-knowledge`` does: a SubmitJob with no credentials."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=COMMAND_JOB), timeout=DEADLINE_S)
    return err.value


def test_an_unauthenticated_command_job_is_refused_by_default(root_dir: Path) -> None:
    daemon = _serve(root_dir)
    try:
        err = _bare_submit(daemon.address)
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        jobs = _cli(daemon, "jobs", "--json")  # the owner's client reads the generated token
        assert jobs.returncode == 0, jobs.stderr
        assert not json.loads(jobs.stdout).get("jobs"), "the refused job was not stored"
    finally:
        _stop(daemon)
    assert f"token in {daemon.state_dir / 'token'}" in daemon.log.read_text()


def test_the_generated_token_and_state_are_private_and_survive_a_restart(root_dir: Path) -> None:
    daemon = _serve(root_dir)
    try:
        token = (daemon.state_dir / "token").read_text()
    finally:
        _stop(daemon)
    assert stat.S_IMODE((daemon.state_dir / "token").stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.state_dir.stat().st_mode) & 0o077 in (0o050, 0o010, 0o000)
    for path in daemon.state_dir.iterdir():  # database, WAL, token: nothing for others
        assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0, path
    again = _serve(root_dir)
    try:
        assert (again.state_dir / "token").read_text() == token, "the token is never replaced"
        assert _cli(again, "nodes").returncode == 0
    finally:
        _stop(again)


def test_an_existing_state_directory_open_to_others_is_tightened(root_dir: Path) -> None:
    state = root_dir / "home" / "hetero"
    state.mkdir(parents=True)
    state.chmod(0o755)
    if OWNER is not None:
        os.chown(state.parent, OWNER, OWNER)
        os.chown(state, OWNER, OWNER)
    _stop(_serve(root_dir))
    assert stat.S_IMODE(state.stat().st_mode) & 0o007 == 0


def test_a_client_never_sends_the_local_token_to_a_remote_address(tmp_path: Path) -> None:
    from hetero.security.transport import client_security

    state = tmp_path / "hetero"
    state.mkdir()
    (state / "token").write_text("x" * 32)
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path)
    try:
        if os.geteuid() != 0:  # root's state directory is /var/lib/hetero, not XDG's
            assert client_security(None, address="127.0.0.1:7070").token is not None
        assert client_security(None, address="10.0.0.1:7070").token is None
    finally:
        if old is None:
            del os.environ["XDG_STATE_HOME"]
        else:
            os.environ["XDG_STATE_HOME"] = old


def test_insecure_is_the_explicit_way_back_to_no_token(root_dir: Path) -> None:
    daemon = _serve(root_dir, "--insecure")
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            stub.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S)
    finally:
        _stop(daemon)
    assert not (daemon.state_dir / "token").exists()
    assert "--insecure: no token; every user who can reach" in daemon.log.read_text()


@needs_root
def test_another_local_user_can_neither_submit_nor_read_the_token_or_database(
    root_dir: Path,
) -> None:
    daemon = _serve(root_dir)
    try:
        own = _cli(daemon, "jobs", "--json")  # the owner's client needs no flag
        assert own.returncode == 0, own.stderr
        stranger = subprocess.run(  # a uid with no account: it has only the network
            _argv(
                NOBODY - 1,
                sys.executable,
                "-c",
                _STRANGER.format(address=daemon.address, state=daemon.state_dir),
            ),
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(root_dir),
            cwd="/",
        )
        assert stranger.returncode == 0, stranger.stderr
        assert stranger.stdout.split() == ["UNAUTHENTICATED", "denied", "denied"]
    finally:
        _stop(daemon)


_STRANGER = """
import os, grpc
from hetero.v1 import coordinator_pb2 as pb, coordinator_pb2_grpc as pb_grpc
ch = grpc.insecure_channel("{address}")
try:
    pb_grpc.CoordinatorStub(ch).SubmitJob(pb.SubmitJobRequest(spec_yaml="name: x"), timeout=5)
    print("ACCEPTED")
except grpc.RpcError as e:
    print(e.code().name)
for name in ("token", "coordinator.db"):
    path = "{state}/" + name
    try:
        open(path).read(1)
        print("read")
    except OSError:
        print("denied")
"""


@needs_root
def test_the_agent_refuses_to_run_ranks_as_root_without_allow_root(tmp_path: Path) -> None:
    """Before: an agent started as root ran every job's ``command:`` as root."""
    argv = [sys.executable, "-m", "hetero.agent.cli", "run", "--coordinator", "127.0.0.1:1"]
    argv += ["--state-dir", str(tmp_path / "agent"), "--quick"]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env(tmp_path))
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "error: refusing to run ranks as root: every job's command would run as root; run the "
        "agent as a service user, or as root with --rank-user NAME (docs/deploy.md), "
        "or pass --allow-root"
    ]
    assert not (tmp_path / "agent" / "profiles").exists(), "refused before the profile"


@needs_root
@pytest.mark.parametrize(
    ("uid", "user", "error"),
    [
        (None, "root", "error: rank_user: root is root; name an unprivileged account"),
        (None, "no-such-user", "error: rank_user: no user 'no-such-user' on this host"),
        (NOBODY, "nobody", "error: rank_user: nobody: starting ranks as another user needs an "),
    ],
    ids=["root", "unknown", "agent-not-root"],
)
def test_a_rank_user_the_agent_cannot_use_is_refused_in_one_line(
    root_dir: Path, uid: int | None, user: str, error: str
) -> None:
    home = root_dir / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    argv = [sys.executable, "-m", "hetero.agent.cli", "run", "--coordinator", "127.0.0.1:1"]
    argv += ["--state-dir", str(home / "agent"), "--quick", "--rank-user", user]
    refused = subprocess.run(
        _argv(uid, *argv), capture_output=True, text=True, timeout=60, env=_env(home)
    )
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith(error), refused.stderr
    assert not (home / "agent" / "profiles").exists(), "refused before the profile"


READ_AGENT_SECRETS = """
import sys
pid, token = sys.argv[1], sys.argv[2]
for name in ("environ", "mem"):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fh:
            data = fh.read() if name == "environ" else fh.read(1)
    except OSError as exc:
        print(f"{name}: {type(exc).__name__}")
    else:
        print(f"{name}: {'TOKEN' if token.encode() in data else 'read'}")
"""


@needs_root
def test_a_process_of_the_agents_user_cannot_read_its_token_from_proc(root_dir: Path) -> None:
    """Issue 33: the agent held ``$HETERO_TOKEN`` (the container deployment) and a rank,
    of the same uid, read it from ``/proc/<agent>/environ`` and drained a node with it.
    Now the agent makes itself undumpable once its credentials are read."""
    home, token = root_dir / "home", "t0ken-" + os.urandom(12).hex()
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    log = root_dir / "agent.log"
    argv = [sys.executable, "-m", "hetero.agent.cli", "run", "--coordinator", "127.0.0.1:1"]
    argv += ["--state-dir", str(home / "agent"), "--quick"]
    with log.open("wb") as out:
        agent = subprocess.Popen(
            _argv(NOBODY, *argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**_env(home), "HETERO_TOKEN": token},
        )
    try:
        # The profile is measured after the credentials are read.
        deadline = time.monotonic() + 60
        while not (home / "agent" / "profiles").exists():
            assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        reader = [sys.executable, "-c", READ_AGENT_SECRETS, str(agent.pid), token]
        seen = subprocess.run(_argv(NOBODY, *reader), capture_output=True, text=True, timeout=60)
        assert seen.stdout.split("\n")[:2] == [
            "environ: PermissionError",
            "mem: PermissionError",
        ], seen.stdout + seen.stderr
    finally:
        agent.terminate()
        agent.wait(timeout=30)


#: A rank's shell script: who it runs as, what of the agent's it can read, and a file of
#: its own in its working directory. (The shell: the test's Python may live where
#: ``nobody`` cannot run it.)
READ_AS_RANK = """
echo "uid $(id -u)"
cat "$1" >/dev/null 2>&1 && echo "token: read" || echo "token: refused"
cat "/proc/$2/environ" >/dev/null 2>&1 && echo "environ: read" || echo "environ: refused"
ls "$(dirname "$1")" >/dev/null 2>&1 && echo "state: listed" || echo "state: refused"
grep NoNewPrivs /proc/self/status
echo ok > mine.txt && echo "wrote $(pwd)"
"""


@needs_root
def test_ranks_under_a_rank_user_read_none_of_the_agents_files(root_dir: Path) -> None:
    """Issue 33: a rank of the agent's own uid read the agent's token file (on one host,
    the coordinator's too). An agent running as root with ``rank_user: nobody`` starts
    each rank as ``nobody``: it can neither read the agent's token file nor its
    ``/proc/<pid>/environ`` nor list its state directory, may gain no privilege (no
    set-uid program), and writes its own working directory; the job succeeds. (Before, the key did not exist: the rank ran as root.)"""
    clock = Clock()
    c = start_coordinator(hand_clocked(f"sqlite:///{root_dir / 'coordinator.db'}", clock), clock)
    state = root_dir / "agent"
    state.mkdir(mode=0o750)
    token_file = state / "token"
    token_file.write_text("t0ken-" + os.urandom(12).hex())
    token_file.chmod(0o600)
    config = AgentConfig(
        coordinator=c.address,
        name="n1",
        address="127.0.0.1",
        local_listen="127.0.0.1:0",
        state_dir=state,
        rank_user="nobody",
    )
    profile = NodeProfile("test cpu", 1, 10.0, 1 << 30, (DeviceMeasure(0, "cpu", "cpu", 1.0),))
    agent = Agent(config, profile)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        command = ["/bin/sh", "-c", READ_AS_RANK, "sh", str(token_file), str(os.getpid())]
        spec = (
            f"name: isolated\ncommand: {json.dumps(command)}\n"
            "global_batch: 8\nsteps: 1\nresources: {ranks: 1, device: cpu}\n"
        )
        deadline = time.monotonic() + 60
        while not c.stub.ListNodes(pb.ListNodesRequest(), timeout=DEADLINE_S).nodes:
            assert time.monotonic() < deadline, "the agent did not register"
            time.sleep(0.2)
        job_id = c.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S).job_id
        ended = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED)
        deadline = time.monotonic() + 120
        while (
            job := c.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S)
        ).state not in ended:
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(0.2)
        log = (state / "jobs" / job_id / "rank0.log").read_text()
        assert job.state == pb.JOB_STATE_SUCCEEDED, log
        assert f"uid {NOBODY}\n" in log, log
        for line in ("token: refused", "environ: refused", "state: refused", "NoNewPrivs:\t1"):
            assert line in log, log
        cwd = state / "jobs" / job_id / "rank0"
        assert (cwd / "mine.txt").read_text() == "ok\n"
        assert cwd.stat().st_uid == NOBODY and stat.S_IMODE(cwd.stat().st_mode) == 0o700
        for passage in (state, state / "jobs", state / "jobs" / job_id):  # pass, not list
            assert stat.S_IMODE(passage.stat().st_mode) & 0o007 == 0o001, passage
        assert stat.S_IMODE((state / "jobs" / job_id / "rank0.log").stat().st_mode) & 0o007 == 0
    finally:
        agent.stop()
        thread.join(timeout=30)
        c.channel.close()
        c.server.stop(0).wait()
