"""Tokens, the listen rule, rank environments, allowed roots and job-spec bounds."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from hetero.agent.orders import rank_process
from hetero.core.errors import ConfigError
from hetero.core.jobspec import parse_jobspec
from hetero.core.roots import check_private, default_roots, path_problem
from hetero.security.auth import AGENT_TOKEN_ENV, Secret, load_token, new_token, scrub_environment
from hetero.security.transport import ServerSecurity, TLSFiles, check_listen, is_loopback
from hetero.v1 import coordinator_pb2 as pb

TOKEN = "s3cret-token-0123456789abcdef"


def test_a_secret_never_shows_in_repr_str_or_pickle() -> None:
    s = Secret(TOKEN)
    assert TOKEN not in repr(s) and TOKEN not in str(s) and TOKEN not in f"{s} {[s]}"
    with pytest.raises(TypeError):
        pickle.dumps(s)
    assert s.matches(TOKEN) and not s.matches(TOKEN + "x") and not s.matches("")


def test_token_comes_from_the_named_file_then_the_env_file_then_the_env_value(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text(f"  {TOKEN}-a\n")
    b.write_text(f"{TOKEN}-b")
    env = {"HETERO_TOKEN_FILE": str(b), "HETERO_TOKEN": f"{TOKEN}-c"}
    assert load_token(a, env).reveal() == f"{TOKEN}-a"  # type: ignore[union-attr]
    assert load_token(None, env).reveal() == f"{TOKEN}-b"  # type: ignore[union-attr]
    assert load_token(None, {"HETERO_TOKEN": f"{TOKEN}-c"}).reveal() == f"{TOKEN}-c"  # type: ignore[union-attr]
    assert load_token(None, {}) is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("short", "token has 5 characters, need at least 16"),
        ("with a space in the middle!!", "printable ASCII without spaces"),
    ],
)
def test_a_weak_or_malformed_token_is_refused_without_echoing_it(
    tmp_path: Path, content: str, expected: str
) -> None:
    f = tmp_path / "token"
    f.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_token(f, {})
    assert expected in str(info.value) and content not in str(info.value)


def test_a_missing_token_file_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read token file .*/nope: No such file"):
        load_token(tmp_path / "nope", {})


def test_ranks_inherit_no_credential_and_get_only_the_agent_endpoint_token(tmp_path: Path) -> None:
    base = {
        "PATH": "/usr/bin",
        "HETERO_TOKEN": TOKEN,
        "HETERO_TOKEN_FILE": "/etc/hetero/token",
        "CREDENTIALS_DIRECTORY": "/run/credentials/hetero-agent.service",
        "HETERO_TLS_KEY": "/etc/hetero/agent.key",
    }
    assert scrub_environment(base) == {"PATH": "/usr/bin"}
    order = pb.RankLaunch(job_id="j1", rank=0, world_size=1, master_port=29500)
    order.args.options.update({"model": "debug", "global_batch": "8", "steps": "10"})
    local = new_token()
    process = rank_process(
        order,
        python="python",
        output_dir=tmp_path,
        agent_endpoint="127.0.0.1:7071",
        threads=1,
        local_world_size=1,
        base=base,
        agent_token=local,
    )
    env, argv = process.env, process.argv
    assert env[AGENT_TOKEN_ENV] == local.reveal()
    assert not set(base) - {"PATH"} & set(env), "the agent's credentials stay with the agent"
    assert not any(local.reveal() in a or TOKEN in a for a in argv), "no token in argv"


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:7070", True),
        ("127.1.2.3:0", True),
        ("[::1]:7070", True),
        ("localhost:7070", True),
        ("unix:/run/hetero.sock", True),
        ("0.0.0.0:7070", False),
        ("[::]:7070", False),
        ("10.0.0.1:7070", False),
        ("coordinator.example:7070", False),
        (":7070", False),
    ],
)
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_non_loopback_listen_needs_a_token_or_mutual_tls_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_listen("0.0.0.0:7070", ServerSecurity(), "coordinator")
    message = str(info.value)
    assert "\n" not in message and "refusing to serve the coordinator on 0.0.0.0:7070" in message
    assert "--insecure" in message and "--token-file" in message
    check_listen("127.0.0.1:7070", ServerSecurity(), "coordinator")
    check_listen("0.0.0.0:7070", ServerSecurity(token=new_token()), "coordinator")
    check_listen("0.0.0.0:7070", ServerSecurity(insecure=True), "coordinator")
    ca = tmp_path / "ca.pem"
    mtls = ServerSecurity(tls=TLSFiles(tmp_path / "c.pem", tmp_path / "k.pem", ca))
    check_listen("0.0.0.0:7070", mtls, "coordinator")
    tls_only = ServerSecurity(tls=TLSFiles(tmp_path / "c.pem", tmp_path / "k.pem"))
    with pytest.raises(ConfigError):
        check_listen("10.0.0.1:7070", tls_only, "coordinator")  # encrypted, but anyone may call


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/srv/ckpt/run1", None),
        ("/srv/ckpt", None),
        ("/tmp/x/../x/y", None),
        ("/srv/ckpt/../../etc/hetero", "/etc/hetero is outside the coordinator's allowed roots"),
        ("/srv/ckptX/evil", "outside the coordinator's allowed roots"),
        ("//etc/passwd", "/etc/passwd is outside"),
        ("ckpt", "must be an absolute path"),
        ("../ckpt", "must be an absolute path"),
        ("/tmp/a\x00b", "NUL"),
        ("/tmp/" + "a" * 5000, "longer than 4096 bytes"),
    ],
)
def test_paths_must_be_absolute_and_under_an_allowed_root(path: str, problem: str | None) -> None:
    found = path_problem(path, ("/srv/ckpt", "/tmp"))
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_the_default_root_is_job_files_in_the_state_dir_never_the_state_home_or_tmp(
    tmp_path: Path,
) -> None:
    """/tmp is writable by every local user: a checkpoint planted there must not be a
    default place a job may resume from. The state directory holds the database and
    the secrets, and the home directory holds the default state directory."""
    state = tmp_path / "state"
    roots = default_roots(state)
    assert roots == (str(state / "job-files"),)
    for path in ("/tmp/ckpt", str(state / "credential-secret"), str(Path.home() / "ckpt")):
        assert path_problem(path, roots) is not None, path
    check_private([("state directory", str(state))], roots)  # not held by the default


@pytest.mark.parametrize("root", ["/", "/var/lib", "/var/lib/hetero"])
def test_no_allowed_root_may_hold_a_daemons_state(root: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_private([("state directory", "/var/lib/hetero")], ["/shared", root])
    assert str(err.value) == (
        f"state directory /var/lib/hetero lies inside the allowed root {root}, where jobs "
        "write: list allowed_roots that do not hold it, or move it out"
    )
    check_private([("state directory", "/var/lib/hetero")], ["/var/lib/hetero-jobs"])


@pytest.mark.parametrize("path", ["/", "/var", "/var/lib/../lib/hetero", "/var/lib/hetero/secret"])
def test_no_job_path_may_hold_the_coordinators_own_files(path: str) -> None:
    private = ("/var/lib/hetero", "/var/lib/hetero/secret")
    problem = path_problem(path, None, private)
    assert problem is not None and "holds the coordinator's own files" in problem
    assert path_problem("/var/lib/hetero-jobs/run", None, private) is None


BASE = """\
name: absurd
model: debug
global_batch: 64
steps: 100
resources:
  ranks: 2
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("global_batch: 0", "global_batch: must be >= 1, got 0"),
        ("global_batch: 2147483648", "global_batch: must be <= 16,777,216"),
        ("steps: 1000000000000", "steps: must be <= 100,000,000, got 1000000000000"),
        ("rebalance_interval: -5", "rebalance_interval: must be >= 1, got -5"),
        ("policy: fastest", "policy: unknown value 'fastest'"),
        ("seed: 18446744073709551616", "seed: must be <= 9,223,372,036,854,775,807"),
        ("max_restarts: 1000000", "max_restarts: must be <= 1,000"),
        ("epochs: 0", "epochs: must be >= 1"),
        ("lr: .nan", "lr: must be finite"),
        ("lr: 1.0e+400", "lr: must be finite"),
        ("steps: !!int abc", "steps: cannot read the value tagged tag:yaml.org,2002:int"),
        ("name: !custom x", "name: cannot read the value tagged !custom"),
        ("checkpoint: {dir: /etc/hetero}", "checkpoint.dir: /etc/hetero is outside"),
        ("checkpoint: {dir: relative/dir}", "checkpoint.dir: must be an absolute path"),
        ("checkpoint: {dir: /tmp/c, interval_steps: 0}", "checkpoint.interval_steps: must be >= 1"),
        ("dataset: imagefolder\ndata_dir: /root/data", "data_dir: /root/data is outside"),
    ],
)
def test_absurd_values_are_rejected_with_a_message_naming_the_field(
    change: str, message: str
) -> None:
    key = change.split(":", 1)[0]
    kept = [line for line in BASE.splitlines() if not line.startswith(f"{key}:")]
    with pytest.raises(ConfigError) as info:
        parse_jobspec("\n".join([*kept, change]) + "\n", allowed_roots=("/tmp", "/srv"))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_resources_ranks_and_command_are_bounded() -> None:
    with pytest.raises(ConfigError, match=r"resources.ranks: must be <= 4,096"):
        parse_jobspec(BASE.replace("ranks: 2", "ranks: 100000"))
    spec = BASE.replace("model: debug\n", 'command: ["python", "a\\0b"]\n')
    with pytest.raises(ConfigError, match="command: arguments must not contain a NUL"):
        parse_jobspec(spec)


def test_an_oversized_spec_is_refused_before_parsing() -> None:
    with pytest.raises(ConfigError, match=r"job spec is 2,097,\d+ characters, limit 1,048,576"):
        parse_jobspec(BASE + "#" * (2 * 1024 * 1024))


def test_deeply_nested_yaml_is_an_error_not_a_recursion_crash() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_jobspec("a: " + "[" * 5_000 + "]" * 5_000)
