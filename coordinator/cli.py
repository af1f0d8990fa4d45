"""``hetero-coord``: run the coordinator daemon, and submit and inspect jobs.

The process wiring of the coordinator: argument parsing, logging, and the thin
gRPC client behind the user commands. Every client call carries a deadline;
every failure prints one ``error: ...`` line on stderr and exits non-zero.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console

from hetero.coordinator import export, render
from hetero.coordinator.config import CoordinatorConfig, load_config, with_flags
from hetero.coordinator.export import FORMATS, TABLES
from hetero.core import defaults
from hetero.core.errors import HeteroError
from hetero.core.jobspec import load_jobspec
from hetero.core.states import JobState, job_terminal
from hetero.logs import configure_logging
from hetero.transport import (
    add_client_arguments,
    client_channel,
    client_security_from_args,
    remote_error,
    server_security,
)
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

#: Seconds each client RPC may take.
DEFAULT_TIMEOUT_S = 10.0
#: Seconds between job polls of ``submit --wait``.
WAIT_POLL_S = 1.0

T = TypeVar("T")

EPILOG = """\
examples:
  hetero-coord serve                                # gRPC on 127.0.0.1:7070
  hetero-coord submit examples/demo.yaml --dry-run  # validate; show placement and predictions
  hetero-coord submit examples/demo.yaml --wait     # submit and follow to the end
  hetero-coord jobs --json
  hetero-coord job 3f2a9c1b7d4e
  hetero-coord nodes
  hetero-coord cancel 3f2a9c1b7d4e
  hetero-coord drain gpu-node-3                     # no new ranks there; --undo to reverse
  hetero-coord export 3f2a9c1b7d4e --format csv --out stats.csv
  hetero-coord serve --metrics-listen 0.0.0.0:9464  # Prometheus /metrics

The coordinator address comes from --coordinator, else $HETERO_COORDINATOR, else 127.0.0.1:7070.
The job file format is documented in docs/jobspec.md.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage mistakes are one ``error:`` line like every other failure."""

    def error(self, message: str) -> Any:
        self.exit(2, f"error: {self.prog}: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hetero-coord",
        description="Coordinator of hetero, heterogeneity-aware data-parallel training: "
        "places ranks on the cluster's devices and re-plans per-rank batch sizes as speeds drift.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the coordinator daemon")
    serve.add_argument(
        "--config",
        type=Path,
        help=f"YAML config (default {defaults.COORDINATOR_CONFIG_PATH} if present)",
    )
    serve.add_argument(
        "--listen", help=f"host:port to serve gRPC on (default {defaults.COORDINATOR_ADDRESS})"
    )
    serve.add_argument(
        "--state-dir",
        type=Path,
        help="state directory (default /var/lib/hetero as root, else ~/.local/state/hetero)",
    )
    serve.add_argument(
        "--db", help="SQLAlchemy database URL (default: SQLite file in the state directory)"
    )
    serve.add_argument(
        "--log-format", choices=defaults.LOG_FORMATS, help="stderr log format (default text)"
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="ADDR",
        help="host:port to serve Prometheus /metrics on (default: off)",
    )
    auth = serve.add_argument_group("authentication (see docs/reliability.md#security)")
    auth.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require this token on every call (else $HETERO_TOKEN_FILE, $HETERO_TOKEN)",
    )
    auth.add_argument("--tls-cert", type=Path, metavar="PEM", help="server certificate: TLS")
    auth.add_argument("--tls-key", type=Path, metavar="PEM", help="server certificate's key")
    auth.add_argument(
        "--tls-ca", type=Path, metavar="PEM", help="require client certificates from this CA"
    )
    auth.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback --listen without authentication (trusted networks only)",
    )
    serve.add_argument(
        "--heartbeat-interval",
        type=float,
        dest="heartbeat_interval_s",
        metavar="S",
        help="seconds between agents' heartbeats, told to them at registration "
        f"(default {defaults.HEARTBEAT_INTERVAL_S:g})",
    )
    serve.add_argument(
        "--heartbeat-timeout",
        type=float,
        dest="heartbeat_timeout_s",
        metavar="S",
        help="a node silent this long is down and its jobs restart "
        f"(default {defaults.HEARTBEAT_TIMEOUT_S:g})",
    )
    keep = serve.add_argument_group("retention (see docs/reliability.md#database-size)")
    keep.add_argument(
        "--telemetry-retention-h",
        type=float,
        metavar="H",
        help="hours of telemetry kept, one row per device per 10 s, at least 1/60 (default 24)",
    )
    keep.add_argument(
        "--interval-stats-raw-h",
        type=float,
        metavar="H",
        help="hours interval statistics are kept whole, at least 1/60 (default 24)",
    )
    keep.add_argument(
        "--interval-stats-thin",
        type=int,
        metavar="N",
        help="past --interval-stats-raw-h, keep 1 interval in N of each job (those whose end "
        "step / rebalance_interval is a multiple of N); 1 keeps all (default 10)",
    )
    keep.add_argument(
        "--interval-stats-keep-days",
        type=float,
        metavar="D",
        help="days after which interval statistics are deleted (default 30)",
    )

    def client(name: str, help_text: str, json_flag: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "--coordinator",
            default=os.environ.get("HETERO_COORDINATOR", defaults.COORDINATOR_ADDRESS),
            help="coordinator host:port",
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT_S,
            help="seconds per request (default 10)",
        )
        if json_flag:
            p.add_argument("--json", action="store_true", help="print JSON instead of tables")
        add_client_arguments(p)
        return p

    submit = client("submit", "submit a job file; prints the job id")
    submit.add_argument("job_file", type=Path, help="job spec (YAML, see docs/jobspec.md)")
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and show placement, initial plan and predicted throughput; store nothing",
    )
    submit.add_argument(
        "--wait",
        action="store_true",
        help="follow the job to its end; exit non-zero unless it succeeds",
    )
    client("jobs", "list jobs, newest first")
    job = client("job", "show one job: ranks, plan, recent events")
    job.add_argument("job_id")
    client("nodes", "list nodes, their devices and latest telemetry")
    cancel = client("cancel", "cancel a job")
    cancel.add_argument("job_id")
    drain = client("drain", "drain a node: it keeps its running ranks but gets no new ones")
    drain.add_argument("node", help="node name or id")
    drain.add_argument("--undo", action="store_true", help="undrain: the node takes ranks again")
    logs = client("logs", "print a job's rank output, as its agents shipped it")
    logs.add_argument("job_id")
    logs.add_argument("--rank", type=int, help="only this rank's lines")
    logs.add_argument(
        "--follow", action="store_true", help="keep printing new lines until the job ends"
    )
    exp = client("export", "write a job's interval statistics and plans", json_flag=False)
    exp.add_argument("job_id")
    exp.add_argument("--format", choices=FORMATS, default="csv", help="default csv")
    exp.add_argument(
        "--table",
        choices=TABLES,
        default="intervals",
        help="CSV only: one row per interval and rank, or one per plan (default intervals)",
    )
    exp.add_argument("--out", type=Path, help="file to write (default: stdout)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        return _client_command(args)
    except HeteroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


# ---- serve --------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from hetero.coordinator.server import serve
    from hetero.coordinator.store import TelemetryPolicy

    config: CoordinatorConfig = with_flags(
        load_config(args.config),
        listen=args.listen,
        state_dir=args.state_dir,
        db=args.db,
        log_format=args.log_format,
        metrics_listen=args.metrics_listen,
        token_file=args.token_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        insecure=args.insecure,
        heartbeat_interval_s=args.heartbeat_interval_s,
        heartbeat_timeout_s=args.heartbeat_timeout_s,
        telemetry_retention_h=args.telemetry_retention_h,
        interval_stats_raw_h=args.interval_stats_raw_h,
        interval_stats_thin=args.interval_stats_thin,
        interval_stats_keep_days=args.interval_stats_keep_days,
    )
    configure_logging(config.log_format)
    security = server_security(
        config.token_file, config.tls_cert, config.tls_key, config.tls_ca, config.insecure
    )
    if config.db is None:
        try:
            config.resolved_state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HeteroError(
                f"cannot create state directory {config.resolved_state_dir}: {exc.strerror}"
            ) from None
    serve(
        config.listen,
        config.db_url,
        grace_s=config.grace_s,
        metrics_listen=config.metrics_listen,
        security=security,
        allowed_roots=config.resolved_allowed_roots,
        heartbeat_interval_s=config.heartbeat_interval_s,
        heartbeat_timeout_s=config.heartbeat_timeout_s,
        master_port_base=config.master_port_base,
        telemetry=TelemetryPolicy(retention_s=config.telemetry_retention_h * 3600),
        interval_retention=config.interval_retention,
    )
    return 0


# ---- client commands --------------------------------------------------------------------


def _call(address: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except grpc.RpcError as exc:
        raise remote_error(exc, f"the coordinator at {address}") from None


def _emit(args: argparse.Namespace, message: Message, human: Callable[[Console], None]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), indent=2))
    else:
        human(Console())


def _client_command(args: argparse.Namespace) -> int:
    if args.command == "submit":
        # Parse locally first: precise errors without a round trip, and nothing is sent.
        load_jobspec(args.job_file)
    with client_channel(args.coordinator, client_security_from_args(args)) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
        t = args.timeout
        call: Callable[[Callable[[], Any]], Any] = lambda fn: _call(args.coordinator, fn)  # noqa: E731
        if args.command == "submit":
            return _submit(args, stub, call)
        if args.command == "jobs":
            resp = call(lambda: stub.ListJobs(pb.ListJobsRequest(), timeout=t))
            _emit(args, resp, lambda c: c.print(render.jobs_table(resp.jobs)))
        elif args.command == "job":
            job = call(lambda: stub.GetJob(pb.GetJobRequest(job_id=args.job_id), timeout=t))
            _emit(args, job, lambda c: render.print_job(c, job))
        elif args.command == "nodes":
            resp = call(lambda: stub.ListNodes(pb.ListNodesRequest(), timeout=t))
            _emit(args, resp, lambda c: c.print(render.nodes_table(resp.nodes)))
        elif args.command == "cancel":
            job = call(lambda: stub.CancelJob(pb.CancelJobRequest(job_id=args.job_id), timeout=t))
            _emit(args, job, lambda c: c.print(f"job {job.id} {render.state_name(job)}"))
        elif args.command == "drain":
            request = pb.DrainNodeRequest(node=args.node, undrain=args.undo)
            node = call(lambda: stub.DrainNode(request, timeout=t))
            what = "drained: no new ranks" if node.draining else "undrained: takes new ranks"
            _emit(args, node, lambda c: c.print(f"node {node.name} {what}"))
        elif args.command == "export":
            return _export(args, stub, call)
        elif args.command == "logs":
            return _logs(args, stub, call)
    return 0


#: Seconds between polls of ``logs --follow`` when nothing new arrived.
FOLLOW_POLL_S = 1.0


def _logs(args: argparse.Namespace, stub: Any, call: Callable[[Callable[[], Any]], Any]) -> int:
    """Page through GetJobLogs; with ``--follow`` poll until the job ends, then drain."""
    t = args.timeout

    def page(after_seq: int) -> Any:
        request = pb.GetJobLogsRequest(job_id=args.job_id, after_seq=after_seq)
        return call(lambda: stub.GetJobLogs(request, timeout=t))

    after = 0
    finished = False
    while True:
        resp = page(after)
        for line in resp.lines:
            if args.rank is not None and line.rank != args.rank:
                continue
            if args.json:
                entry = MessageToDict(
                    line,
                    preserving_proto_field_name=True,
                    always_print_fields_with_no_presence=True,  # rank 0 is a rank
                )
                print(json.dumps(entry))
            else:
                print(f"[rank {line.rank} {line.stream}] {line.text.rstrip()}")
        after = max(after, resp.next_seq)
        if resp.lines:
            continue  # more pages may be waiting
        if not args.follow or finished:
            return 0
        job = call(lambda: stub.GetJob(pb.GetJobRequest(job_id=args.job_id), timeout=t))
        # One more pass after the job ends: agents ship the last lines as ranks exit.
        finished = job_terminal(job.state)
        time.sleep(FOLLOW_POLL_S)


#: Intervals per GetJobDetail page of an export (a page stays far below gRPC's 4 MiB).
EXPORT_PAGE = 500


def _export(args: argparse.Namespace, stub: Any, call: Callable[[Callable[[], Any]], Any]) -> int:
    """Page through the job's intervals from the start, then write one document."""
    intervals: list[Any] = []
    after = -1
    while True:
        request = pb.GetJobDetailRequest(
            job_id=args.job_id, max_intervals=EXPORT_PAGE, after_step=after
        )
        detail = call(functools.partial(stub.GetJobDetail, request, timeout=args.timeout))
        intervals.extend(detail.intervals)
        if not detail.more or not detail.intervals:
            break
        after = detail.intervals[-1].end_step
    text = export.render(args.format, args.table, detail.job, detail.plans, intervals)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise HeteroError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {len(intervals)} intervals of job {args.job_id} to {args.out}", file=sys.stderr)
    return 0


def _submit(args: argparse.Namespace, stub: Any, call: Callable[[Callable[[], Any]], Any]) -> int:
    text = args.job_file.read_text(encoding="utf-8")
    request = pb.SubmitJobRequest(
        spec_yaml=text, source_name=str(args.job_file), dry_run=args.dry_run
    )
    resp = call(lambda: stub.SubmitJob(request, timeout=args.timeout))
    if args.dry_run:

        def human(c: Console) -> None:
            render.print_job(c, resp.job)
            c.print(render.predictions_table(resp.predictions, resp.job.global_batch))

        _emit(args, resp, human)
        return 0
    if args.json and not args.wait:
        _emit(args, resp, lambda c: None)
    elif not args.json:
        print(resp.job_id)
    if not args.wait:
        return 0
    return _wait(args, stub, call, resp.job_id)


def _wait(
    args: argparse.Namespace, stub: Any, call: Callable[[Callable[[], Any]], Any], job_id: str
) -> int:
    """Poll the job until it finishes; print each state change on stderr."""
    last = None
    while True:
        job = call(lambda: stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=args.timeout))
        state = render.state_name(job)
        if state != last:
            print(
                f"job {job_id}: {state}" + (f" ({job.message})" if job.message else ""),
                file=sys.stderr,
            )
            last = state
        if job_terminal(job.state):
            if args.json:
                _emit(args, job, lambda c: None)
            return 0 if JobState(job.state) is JobState.SUCCEEDED else 1
        time.sleep(WAIT_POLL_S)


if __name__ == "__main__":
    sys.exit(main())
