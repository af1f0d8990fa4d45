"""hetero-coord as a user runs it: a subprocess against a real coordinator."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo.yaml"


def _cli(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hetero.coordinator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


def test_a_bad_job_file_is_one_line_error_and_stores_nothing(coordinator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "job.yaml"
    bad.write_text(DEMO.read_text().replace("global_batch: 96", "global_batch: 0"))
    result = _cli("submit", str(bad), "--coordinator", coordinator.address)
    assert result.returncode == 2
    assert _one_error_line(result) == f"error: {bad}:7: global_batch: must be >= 1, got 0"
    assert coordinator.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs == []
    missing = _cli("submit", str(tmp_path / "nope.yaml"), "--coordinator", coordinator.address)
    assert missing.returncode == 2 and "cannot read job file" in _one_error_line(missing)


def test_submit_dry_run_then_submit_and_read_back_as_json(coordinator) -> None:  # type: ignore[no-untyped-def]
    coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(
            name="laptop",
            address="127.0.0.1",
            devices=[
                tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
            ],
        ),
        timeout=5,
    )
    dry = _cli("submit", str(DEMO), "--dry-run", "--coordinator", coordinator.address)
    assert dry.returncode == 0, dry.stderr
    assert "EMULATED" in dry.stdout and "dynamic" in dry.stdout and "equal" in dry.stdout
    assert coordinator.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs == []

    sub = _cli("submit", str(DEMO), "--coordinator", coordinator.address)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    jobs = json.loads(_cli("jobs", "--json", "--coordinator", coordinator.address).stdout)
    assert [j["id"] for j in jobs["jobs"]] == [job_id]
    job = json.loads(_cli("job", job_id, "--json", "--coordinator", coordinator.address).stdout)
    assert job["state"] == "PENDING" and job["plan"]["batches"] == [32, 32, 32]
    cancel = _cli("cancel", job_id, "--coordinator", coordinator.address)
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout


def _long_enum_names(doc: object) -> list[str]:
    """Every string in ``doc`` that is an enum value's full proto name."""
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in _long_enum_names(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _long_enum_names(v)]
    prefixes = ("JOB_STATE_", "RANK_STATE_", "DEVICE_KIND_")
    return [doc] if isinstance(doc, str) and doc.startswith(prefixes) else []


def test_every_json_output_has_defaults_short_enum_names_and_integer_numbers(coordinator) -> None:  # type: ignore[no-untyped-def]
    """Issue #34: ``--json`` dropped zero values (rank 0 had no ``rank``), printed 64-bit
    integers as strings (``"seq": "1"``) and states as ``JOB_STATE_SUCCEEDED``."""
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    request = pb.RegisterNodeRequest(name="laptop", address="127.0.0.1", devices=[device])
    coordinator.stub.RegisterNode(request, timeout=5)
    at = ("--coordinator", coordinator.address)

    def doc(*args: str) -> Any:
        result = _cli(*args, "--json", *at)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    dry = doc("submit", str(DEMO), "--dry-run")
    assert dry["job"]["id"] == "" and dry["job"]["state"] == "UNSPECIFIED"
    submitted = doc("submit", str(DEMO))
    job_id = submitted["job_id"]
    job = doc("job", job_id)
    assert job["state"] == "PENDING" and job["last_step"] == 0 and job["restarts"] == 0
    assert [r["rank"] for r in job["ranks"]] == [0, 1, 2]
    assert {r["device_kind"] for r in job["ranks"]} == {"CPU"}
    assert {r["state"] for r in job["ranks"]} <= {"UNSPECIFIED", "ASSIGNED"}
    assert job["ranks"][0]["exit_code"] is None and job["live"] is None, "unset is null"
    assert job["plan"]["version"] == 1 and job["total_steps"] == 300
    listed = doc("jobs")
    assert listed["total"] == 1 and listed["next_page_token"] == ""
    assert listed["jobs"][0]["ranks"][0]["rank"] == 0
    nodes = doc("nodes")
    assert nodes["nodes"][0]["devices"][0]["index"] == 0
    assert nodes["nodes"][0]["devices"][0]["kind"] == "CPU"
    drained = doc("drain", "laptop")
    assert drained["draining"] is True

    lines = [pb.LogLine(rank=r, stream="stdout", text=f"hello from {r}") for r in (0, 1)]
    coordinator.stub.AppendJobLogs(pb.AppendJobLogsRequest(job_id=job_id, lines=lines), timeout=5)
    logs = _cli("logs", job_id, "--json", *at)
    entries = [json.loads(x) for x in logs.stdout.splitlines()]
    assert [(e["rank"], type(e["seq"])) for e in entries] == [(0, int), (1, int)]
    cancelled = doc("cancel", job_id)
    assert cancelled["state"] == "CANCELLED"
    everything = [dry, submitted, job, listed, nodes, drained, entries, cancelled]
    assert _long_enum_names(everything) == []


def test_tables_in_a_pipe_cut_no_cell(coordinator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue #34: piped, ``hetero-coord jobs`` was cut to 80 columns: states read "pen…",
    names "a-ra…", so ``| grep pending`` found nothing."""
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    request = pb.RegisterNodeRequest(name="laptop", address="127.0.0.1", devices=[device])
    coordinator.stub.RegisterNode(request, timeout=5)
    named = tmp_path / "job.yaml"
    long_name = "a-rather-long-job-name-that-says-what-it-trains"
    named.write_text(DEMO.read_text().replace("name: demo", f"name: {long_name}"))
    assert _cli("submit", str(named), "--coordinator", coordinator.address).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    command = [sys.executable, "-m", "hetero.coordinator.cli", "jobs"]
    jobs = subprocess.run(
        [*command, "--coordinator", coordinator.address],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert jobs.returncode == 0, jobs.stderr
    row = next(line for line in jobs.stdout.splitlines() if long_name in line)
    assert "pending" in row and "…" not in jobs.stdout, jobs.stdout


def test_unknown_ids_and_unreachable_coordinators_are_one_line_errors(coordinator) -> None:  # type: ignore[no-untyped-def]
    result = _cli("job", "nope", "--coordinator", coordinator.address)
    assert result.returncode == 1 and _one_error_line(result) == "error: unknown job 'nope'"
    result = _cli("nodes", "--coordinator", "127.0.0.1:1", "--timeout", "2")
    assert result.returncode == 3
    assert "cannot reach the coordinator at 127.0.0.1:1" in _one_error_line(result)
    result = _cli("frobnicate")
    assert result.returncode == 2 and "invalid choice" in _one_error_line(result)


def test_health_prints_serving_and_an_unknown_service_is_one_line(coordinator) -> None:  # type: ignore[no-untyped-def]
    result = _cli("health", "--coordinator", coordinator.address)
    assert result.returncode == 0 and result.stdout == "SERVING\n", result.stderr
    api = _cli("health", "--service", "hetero.v1.Coordinator", "--coordinator", coordinator.address)
    assert api.returncode == 0 and api.stdout == "SERVING\n", api.stderr
    unknown = _cli("health", "--service", "nope", "--coordinator", coordinator.address)
    assert unknown.returncode != 0 and "nope" not in unknown.stdout
    assert "has no service 'nope'" in _one_error_line(unknown)
    down = _cli("health", "--coordinator", "127.0.0.1:1", "--timeout", "2")
    assert down.returncode != 0 and _one_error_line(down)


def test_serve_refuses_a_database_of_a_newer_schema(tmp_path: Path) -> None:
    from hetero.coordinator.database import open_database

    db = tmp_path / "new.db"
    open_database(f"sqlite:///{db}").dispose()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0999'")
    state = ("--state-dir", str(tmp_path / "state"))
    result = _cli("serve", "--db", f"sqlite:///{db}", "--listen", "127.0.0.1:0", *state)
    assert result.returncode == 3
    assert "schema revision 0999, which this coordinator" in _one_error_line(result)


def test_serve_refuses_bad_retention_flags_in_one_line(tmp_path: Path) -> None:
    db = ("--db", f"sqlite:///{tmp_path / 'c.db'}", "--listen", "127.0.0.1:0")
    db += ("--state-dir", str(tmp_path / "state"))
    cases = [
        (("--interval-stats-raw-h", "0.001"), "interval_stats_raw_h: the raw window must be"),
        (("--interval-stats-thin", "0"), "interval_stats_thin must be a whole number >= 1"),
        (("--interval-stats-thin", "two"), "argument --interval-stats-thin: invalid int value"),
        (
            ("--interval-stats-raw-h", "48", "--interval-stats-keep-days", "1"),
            "interval_stats_keep_days (1 d) must be at least the raw window",
        ),
        (("--telemetry-retention-h", "nan"), "telemetry_retention_h must be at least"),
    ]
    for flags, message in cases:
        result = _cli("serve", *db, *flags)
        assert result.returncode == 2, (flags, result.stderr)
        assert message in _one_error_line(result)
    assert not (tmp_path / "c.db").exists(), "refused before opening the database"


def test_a_job_file_that_is_not_utf8_or_endless_is_one_line(coordinator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 17: a non-UTF-8 file gave a 17-line traceback, ``/dev/zero`` a MemoryError
    (now at most the 1 MiB limit + 1 byte is read)."""
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(DEMO.read_bytes() + b"# caf\xe9\n")
    bad = _cli("submit", str(latin), "--coordinator", coordinator.address)
    assert bad.returncode == 2
    line = DEMO.read_bytes().count(b"\n") + 1
    assert _one_error_line(bad).startswith(f"error: {latin}:{line}: job file is not UTF-8 text")
    zero = _cli("submit", "/dev/zero", "--coordinator", coordinator.address)
    assert zero.returncode == 2
    assert _one_error_line(zero) == (
        "error: /dev/zero: job file is longer than the limit of 1,048,576 bytes"
    )
    assert coordinator.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs == []


def test_a_database_password_is_never_printed_and_a_missing_driver_is_named(tmp_path: Path) -> None:
    """Issue 17: ``--db`` with a password printed it; a URL whose driver is absent traced back."""
    secret = "s3cret-pw"
    no_driver = _cli(
        "serve",
        "--db",
        f"postgresql+psycopg2://hetero:{secret}@db/x",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        str(tmp_path),
    )
    assert no_driver.returncode == 3
    assert _one_error_line(no_driver) == (
        "error: database URL postgresql+psycopg2://hetero:***@db/x needs the Python driver "
        "'psycopg2', which is not installed: pip install 'psycopg2-binary'"
    )
    for url in (
        f"nosuchdb://hetero:{secret}@db/x",
        f"postgresql:/hetero:{secret}@@db",
        f"sqlite:///{tmp_path}/absent/dir/c.db?password={secret}",
    ):
        result = _cli("serve", "--db", url, "--listen", "127.0.0.1:0")
        assert result.returncode == 3, result.stderr
        assert secret not in _one_error_line(result) and secret not in result.stdout


def test_hetero_top_with_a_wrong_token_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    """Issue 17: hetero-top with a token the coordinator refuses exited 0."""
    from hetero.coordinator.server import Settings, create_server
    from hetero.security.auth import Secret
    from hetero.security.transport import ServerSecurity

    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    server, port = create_server("127.0.0.1:0", deps, ServerSecurity(token=Secret("a" * 32)))
    server.start()
    wrong = tmp_path / "wrong"
    wrong.write_text("b" * 32 + "\n")
    wrong.chmod(0o600)
    try:
        top = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from hetero.tui.app import main; sys.exit(main())",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--token-file",
                str(wrong),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    finally:
        server.stop(0).wait()
    assert top.returncode != 0
    # The terminal's escape sequences aside (the UI drew and left), one line: the error.
    text = re.sub(r"\x1b(\[[0-9;?<>=$]*[A-Za-z~]|\][^\x07\x1b]*(\x07|\x1b\\)?|.)", "", top.stderr)
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines == [
        "error: hetero-top: unauthenticated: the coordinator did not accept the token "
        "(--token-file or $HETERO_TOKEN_FILE)"
    ], top.stderr


def test_logs_filters_by_rank_prints_json_and_follow_ends_with_the_job(coordinator) -> None:  # type: ignore[no-untyped-def]
    coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(
            name="laptop",
            address="127.0.0.1",
            devices=[
                tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
            ],
        ),
        timeout=5,
    )
    job_id = _cli("submit", str(DEMO), "--coordinator", coordinator.address).stdout.strip()
    lines = [pb.LogLine(rank=r, stream="stdout", text=f"hello from {r}") for r in (0, 1, 1)]
    coordinator.stub.AppendJobLogs(pb.AppendJobLogsRequest(job_id=job_id, lines=lines), timeout=5)

    one = _cli("logs", job_id, "--rank", "1", "--coordinator", coordinator.address)
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == ["[rank 1 stdout] hello from 1"] * 2
    as_json = _cli("logs", job_id, "--json", "--coordinator", coordinator.address)
    assert [json.loads(x)["rank"] for x in as_json.stdout.splitlines()] == [0, 1, 1]

    coordinator.stub.CancelJob(pb.CancelJobRequest(job_id=job_id), timeout=5)
    followed = _cli("logs", job_id, "--follow", "--coordinator", coordinator.address)
    assert followed.returncode == 0 and len(followed.stdout.splitlines()) == 3
    unknown = _cli("logs", "nope", "--coordinator", coordinator.address)
    assert unknown.returncode != 0 and "nope" in _one_error_line(unknown)


#: What a job's output or a node's fields carried in issue 33: title, clipboard, clear
#: screen, alternate screen, and a C1 CSI.
TERMINAL_ATTACK = "\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[?1049h\x9b2J"


def _controls(text: str) -> list[str]:
    """The control characters (C0 but newline, DEL, C1) in ``text``."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0]


def test_job_output_and_node_fields_cannot_drive_the_terminal(coordinator) -> None:  # type: ignore[no-untyped-def]
    coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(
            name="laptop",
            address="127.0.0.1",
            devices=[
                tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
            ],
        ),
        timeout=5,
    )
    # The API refuses such a name now (``coordinator.bounds``); a database an older
    # coordinator wrote may still hold one.
    with sqlite3.connect(coordinator.db_path) as db:
        db.execute("UPDATE devices SET name = ?", (f"cpu{TERMINAL_ATTACK}",))
    coordinator.restart()
    job_id = _cli("submit", str(DEMO), "--coordinator", coordinator.address).stdout.strip()
    line = pb.LogLine(rank=0, stream="stdout", text=f"step 1 {TERMINAL_ATTACK} loss 0.5")
    coordinator.stub.AppendJobLogs(pb.AppendJobLogsRequest(job_id=job_id, lines=[line]), timeout=5)

    logs = _cli("logs", job_id, "--coordinator", coordinator.address)
    assert logs.returncode == 0, logs.stderr
    assert _controls(logs.stdout) == []
    assert "\\x1b]0;pwned\\x07" in logs.stdout and "\\x9b2J loss 0.5" in logs.stdout
    raw = _cli("logs", job_id, "--raw", "--coordinator", coordinator.address)
    assert TERMINAL_ATTACK in raw.stdout, "--raw gives the text as shipped"

    nodes = _cli("nodes", "--coordinator", coordinator.address)
    assert nodes.returncode == 0, nodes.stderr
    assert _controls(nodes.stdout) == [] and "\\x1b" in nodes.stdout
