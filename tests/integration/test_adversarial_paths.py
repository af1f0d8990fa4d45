"""Attack: a job's paths reach another owner's directory or a daemon's own files (issue #33).

Another user's job took a job's checkpoint directory, which ``GetJob`` shows to any
user: its ``last.pt`` replaced the first job's, whose restarts were then refused
until it FAILED. And the default allowed roots held the coordinator's state
directory: a ``data_dir`` pointing at its ``credential-secret`` passed the check, and
a checkpoint could be written beside its database. Now a directory of another owner's
active job is refused at submit (``coordinator.jobdirs``), no allowed root may hold a
daemon's state directory (the coordinator and the agent refuse to start), and a job
path that holds it is refused (``core.roots``). Real coordinator on port 0 with SQLite
under tmp_path, real ``hetero-coord serve`` and ``hetero-agent run`` processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from servedprocess import serve, wait_for_line

from hetero.coordinator.roles import NAMED
from hetero.coordinator.server import Settings, create_server
from hetero.security.auth import load_token, local_token_path, new_token
from hetero.security.credentials import NamedCredentials
from hetero.security.transport import ClientSecurity, ServerSecurity, client_channel
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0
#: Seconds a daemon refusing its configuration may take to say so (a loaded runner).
REFUSE_S = 60.0

JOB = """\
name: {name}
model: simple_cnn
global_batch: 8
steps: 5
{paths}
resources: {{ranks: 1, device: cpu}}
"""


def _job(name: str, checkpoint: Path | None = None, **paths: Path) -> str:
    lines = [f"checkpoint: {{dir: {checkpoint}}}"] if checkpoint else []
    lines += [f"{key}: {value}" for key, value in paths.items()]
    if "data_dir" in paths:
        lines.append("dataset: cifar10")  # a dataset read from files
    return JOB.format(name=name, paths="\n".join(lines))


class Users:
    """A coordinator with named user credentials, and a stub per user."""

    def __init__(self, address: str, credentials: NamedCredentials) -> None:
        self.address = address
        self.credentials = credentials

    def stub(self, kind: str, name: str) -> pb_grpc.CoordinatorStub:
        token = self.credentials.mint(kind, name)
        return pb_grpc.CoordinatorStub(client_channel(self.address, ClientSecurity(token=token)))

    def submit(self, user: str, spec: str) -> pb.SubmitJobResponse:
        req = pb.SubmitJobRequest(spec_yaml=spec)
        return self.stub("user", user).SubmitJob(req, timeout=DEADLINE_S)


@pytest.fixture
def users(tmp_path: Path) -> Iterator[Users]:
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", allowed_roots=(str(tmp_path / "shared"),)
    )
    credentials = NamedCredentials(new_token(), NAMED)
    security = ServerSecurity(token=new_token(), named=credentials)
    server, port = create_server("127.0.0.1:0", settings, security)
    server.start()
    try:
        served = Users(f"127.0.0.1:{port}", credentials)
        device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1)
        req = pb.RegisterNodeRequest(name="node-a", address="10.0.0.2", devices=[device])
        served.stub("node", "node-a").RegisterNode(req, timeout=DEADLINE_S)
        yield served
    finally:
        server.stop(0).wait()


def _refused(call: Callable[[], object], code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    return str(err.value.details())


def test_a_checkpoint_directory_of_another_owners_active_job_is_refused_at_submit(
    users: Users, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    ana = users.submit("ana", _job("ana-1", shared / "ana")).job_id
    taken = _refused(
        lambda: users.submit("bob", _job("bob-1", shared / "ana")),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert taken == (
        f"job.yaml: checkpoint.dir: {shared / 'ana'} is {shared / 'ana'}, a directory of job "
        f"{ana} (another owner's, not finished); give this job a directory of its own"
    )
    assert "ana" not in taken.replace(str(shared / "ana"), "").replace("ana-1", ""), taken
    for spec, shared_as in (
        (_job("bob-2", shared / "ana" / "sub"), "lies in"),
        (_job("bob-3", shared), "holds"),
        (_job("bob-4", tensorboard=shared / "ana" / ".." / "ana"), "is"),
    ):
        message = _refused(lambda: users.submit("bob", spec), grpc.StatusCode.FAILED_PRECONDITION)  # noqa: B023
        assert f" {shared_as} {shared / 'ana'}, a directory of job {ana} " in message

    again = users.submit("ana", _job("ana-2", shared / "ana")).job_id  # the owner resumes
    users.submit("bob", _job("bob-5", shared / "bob"))  # a directory of its own
    for job_id in (ana, again):
        cancel = pb.CancelJobRequest(job_id=job_id)
        users.stub("user", "ana").CancelJob(cancel, timeout=DEADLINE_S)
    users.submit("bob", _job("bob-6", shared / "ana"))  # free once ana's jobs ended


def test_the_default_root_holds_neither_the_state_directory_nor_its_secrets(
    tmp_path: Path,
) -> None:
    """The issue's ``data_dir`` at the coordinator's ``credential-secret``, and a
    checkpoint beside its database, against ``hetero-coord serve`` as it starts by
    default; a job in its default root (``job-files`` in the state directory) is taken."""
    proc, log = serve(tmp_path)
    try:
        port = wait_for_line(proc, log, r"coordinator listening on \S+ \(port (\d+)").group(1)
        state = tmp_path / "state"
        token = load_token(None, fallback=local_token_path(state))
        with client_channel(f"127.0.0.1:{port}", ClientSecurity(token=token)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU)
            device.compute_score = 1.0
            req = pb.RegisterNodeRequest(name="node-a", address="10.0.0.2", devices=[device])
            stub.RegisterNode(req, timeout=DEADLINE_S)

            def submit(spec: str) -> object:
                return stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=DEADLINE_S)

            outside = f"outside the coordinator's allowed roots ({state / 'job-files'})"
            for spec, why in (
                (_job("secret", data_dir=state / "credential-secret"), "the coordinator's own"),
                (_job("beside-the-database", state), "the coordinator's own files"),
                (_job("in-the-state", state / "jobs"), outside),
                (_job("home", Path.home() / "ckpt"), outside),
            ):
                message = _refused(lambda: submit(spec), grpc.StatusCode.INVALID_ARGUMENT)  # noqa: B023
                assert why in message and "\n" not in message, message
            submit(_job("taken", state / "job-files" / "run-1"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_job_path_that_holds_the_coordinators_files_is_refused(tmp_path: Path) -> None:
    """Where no root is checked (an embedding's ``Settings``), a path that holds the
    coordinator's own files is refused all the same."""
    state = tmp_path / "var" / "hetero"
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", private_paths=(str(state), str(tmp_path / "c.db"))
    )
    server, port = create_server("127.0.0.1:0", settings)
    server.start()
    try:
        stub = pb_grpc.CoordinatorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1)
        stub.RegisterNode(
            pb.RegisterNodeRequest(name="n", address="10.0.0.2", devices=[device]),
            timeout=DEADLINE_S,
        )
        for spec, held in (
            (_job("root", data_dir=Path("/")), state),
            (_job("var", tmp_path / "var"), state),
            (_job("db", data_dir=tmp_path / "c.db"), tmp_path / "c.db"),
        ):
            req = pb.SubmitJobRequest(spec_yaml=spec)
            message = _refused(
                lambda: stub.SubmitJob(req, timeout=DEADLINE_S),  # noqa: B023
                grpc.StatusCode.INVALID_ARGUMENT,
            )
            assert f"holds the coordinator's own files ({held}): no job path may" in message
    finally:
        server.stop(0).wait()


def _refuses_to_start(argv: list[str], env: dict[str, str] | None = None) -> str:
    """The one line a daemon prints as it exits non-zero, refusing its configuration."""
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=REFUSE_S, check=False, env=env
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    ("root", "database", "held"),
    [
        ("/", None, "state directory {tmp}/state"),
        ("{tmp}", None, "state directory {tmp}/state"),
        ("{tmp}/state", None, "state directory {tmp}/state"),
        ("{tmp}/shared", "sqlite:///{tmp}/shared/c.db", "database {tmp}/shared/c.db"),
    ],
)
def test_the_coordinator_refuses_to_start_when_an_allowed_root_holds_its_state(
    tmp_path: Path, root: str, database: str | None, held: str
) -> None:
    root, held = root.format(tmp=tmp_path), held.format(tmp=tmp_path)
    config = tmp_path / "coordinator.yaml"
    config.write_text(f"allowed_roots: [{root}]\n")
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "hetero.coordinator.cli", "serve", "--config", str(config)]
    argv += ["--listen", "127.0.0.1:0", "--state-dir", str(state)]
    if database is not None:
        argv += ["--db", database.format(tmp=tmp_path)]
    line = _refuses_to_start(argv)
    assert line == (
        f"error: {held} lies inside the allowed root {root}, where jobs write: list "
        "allowed_roots that do not hold it, or move it out"
    )
    assert not state.exists(), "refused before anything was made"


def test_an_agent_refuses_to_run_when_its_state_lies_in_an_allowed_root(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}", allowed_roots=(str(shared),))
    server, port = create_server("127.0.0.1:0", settings)
    server.start()
    try:
        argv = [sys.executable, "-m", "hetero.agent.cli", "run"]
        argv += ["--coordinator", f"127.0.0.1:{port}", "--name", "node-a", "--quick"]
        argv += ["--state-dir", str(shared / "agent"), "--local-listen", "127.0.0.1:0"]
        if os.geteuid() == 0:
            argv.append("--allow-root")
        env = dict(os.environ, HETERO_STATE_DIR=str(tmp_path / "home-state"))
        line = _refuses_to_start(argv, env)
    finally:
        server.stop(0).wait()
    assert line == (
        f"error: agent state directory {shared / 'agent'} lies inside the allowed root "
        f"{shared}, where jobs write: list allowed_roots that do not hold it, or move it out"
    )
