"""The client commands of ``hetero-coord``: submit, jobs, job, nodes, cancel, drain,
logs, export and health, each a thin gRPC client of the coordinator. The daemon's
``coordinator.cli`` adds their parsers (``add_commands``) and hands them to ``run``.

Every call carries a deadline (``--timeout``); a failed one becomes the
``HeteroError`` its status maps to (``transport.remote_error``), with the
server's one-line message. Tables come from ``render``, files from
``export``; ``--json`` prints the reply as JSON instead, in the shape ``apijson``
gives it (every field, short enum names, integers as numbers).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

from hetero.client import export, render
from hetero.client.apijson import api_dict
from hetero.core import defaults
from hetero.core.errors import COORDINATOR_HINT, ConfigError, HeteroError, UnknownNameError
from hetero.core.failure import failed_rank
from hetero.core.jobspec import check_priority, parse_jobspec, read_job_file
from hetero.core.states import JobState, job_terminal
from hetero.core.textsafe import printable
from hetero.security.transport import (
    add_client_arguments,
    client_channel,
    client_security_from_args,
    remote_error,
)
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

#: Seconds each RPC may take, unless ``--timeout``.
DEFAULT_TIMEOUT_S = 10.0
#: Seconds between job polls of ``submit --wait``.
WAIT_POLL_S = 1.0

T = TypeVar("T")


def _call(address: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except grpc.RpcError as exc:
        raise remote_error(exc, f"the coordinator at {address}", hint=COORDINATOR_HINT) from None


#: Columns of a table written to a pipe or a file: so many that no cell is cut ("suc…"
#: for succeeded defeats a grep), as kubectl prints; a table is only as wide as its
#: cells. A terminal's own width, or $COLUMNS, still rules.
PIPE_COLUMNS = 1000


def _console() -> Console:
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPE_COLUMNS)


def _emit(args: argparse.Namespace, message: Message, human: Callable[[Console], None]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(api_dict(message), indent=2))
    else:
        human(_console())


def add_commands(sub: argparse._SubParsersAction[Any]) -> None:
    """The client commands' parsers, added to ``hetero-coord``'s subcommands."""

    def client(name: str, help_text: str, json_flag: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
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
        help="follow the job to its end; exit non-zero unless it succeeds; a rank whose exit "
        "failed the job has its last 20 output lines printed",
    )
    submit.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="queue priority while devices are busy, higher first (default: the spec's "
        "priority, else 0)",
    )
    jobs = client("jobs", "list jobs, newest first (the 100 newest unless told)")
    shown = jobs.add_mutually_exclusive_group()
    shown.add_argument(
        "--limit", type=int, default=100, metavar="N", help="show the N newest jobs (default 100)"
    )
    shown.add_argument("--all", action="store_true", help="show every job (page by page)")
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
    logs.add_argument(
        "--raw", action="store_true", help="control characters as shipped (default: escaped)"
    )
    exp = client("export", "write a job's interval statistics and plans", json_flag=False)
    exp.add_argument("job_id")
    exp.add_argument("--format", choices=export.FORMATS, default="csv", help="default csv")
    exp.add_argument(
        "--table",
        choices=export.TABLES,
        default="intervals",
        help="CSV only: one row per interval and rank, or one per plan (default intervals)",
    )
    exp.add_argument("--out", type=Path, help="file to write (default: stdout)")
    health = client("health", "gRPC health check: prints SERVING and exits 0, else 1", False)
    health.add_argument(
        "--service",
        default="",
        help="service name to check (default: the server as a whole; "
        "hetero.v1.Coordinator for the API)",
    )


def run(args: argparse.Namespace) -> int:
    text = ""
    if args.command == "submit":
        # Read once, bounded; parse locally first: precise errors without a round trip,
        # and nothing is sent.
        text = read_job_file(args.job_file)
        parse_jobspec(text, source=str(args.job_file))
    with client_channel(args.coordinator, client_security_from_args(args)) as channel:
        if args.command == "health":
            return _health(args, channel)
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
        t = args.timeout
        call: Callable[[Callable[[], Any]], Any] = lambda fn: _call(args.coordinator, fn)  # noqa: E731
        if args.command == "submit":
            return _submit(args, text, stub, call)
        if args.command == "jobs":
            resp = _jobs(args, stub, call)
            _emit(args, resp, lambda c: render.print_jobs(c, resp))
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


def _jobs(args: argparse.Namespace, stub: Any, call: Callable[[Callable[[], Any]], Any]) -> Any:
    """The newest ``--limit`` jobs, or ``--all``, following ``ListJobs``' pages into one
    ``ListJobsResponse`` (its ``next_page_token`` set when more jobs were left out)."""
    if args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    wanted = None if args.all else args.limit
    out, token = pb.ListJobsResponse(), ""
    while True:
        page_size = 1000 if wanted is None else min(1000, wanted - len(out.jobs))
        request = pb.ListJobsRequest(limit=page_size, page_token=token)
        resp = call(functools.partial(stub.ListJobs, request, timeout=args.timeout))
        out.jobs.extend(resp.jobs)
        out.total, out.next_page_token = resp.total, resp.next_page_token
        token = resp.next_page_token
        if not token or (wanted is not None and len(out.jobs) >= wanted):
            return out


def _health(args: argparse.Namespace, channel: grpc.Channel) -> int:
    """The standard gRPC health check (``grpc.health.v1.Health/Check``) of ``--service``
    ("" = the server as a whole): prints the status; 0 if SERVING, else 1. What a
    container's HEALTHCHECK or a load balancer's probe runs."""
    stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
    request = health_pb2.HealthCheckRequest(service=args.service)
    try:
        resp = stub.Check(request, timeout=args.timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:  # the health service's answer has no text
            raise UnknownNameError(
                f"the coordinator at {args.coordinator} has no service {args.service!r}"
            ) from None
        raise remote_error(
            exc, f"the coordinator at {args.coordinator}", hint=COORDINATOR_HINT
        ) from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    print(status)
    return 0 if resp.status == health_pb2.HealthCheckResponse.SERVING else 1


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
                print(json.dumps(api_dict(line)))  # one line each: JSON Lines
            else:
                text = line.text.rstrip()  # --raw: the bytes as shipped, for a pipe
                print(f"[rank {line.rank} {line.stream}] {text if args.raw else printable(text)}")
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


def _submit(
    args: argparse.Namespace, text: str, stub: Any, call: Callable[[Callable[[], Any]], Any]
) -> int:
    request = pb.SubmitJobRequest(
        spec_yaml=text, source_name=str(args.job_file), dry_run=args.dry_run
    )
    if args.priority is not None:
        check_priority(args.priority)
        request.priority = args.priority
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
    """Poll the job until it finishes; print each state change on stderr and, when a rank
    failed it, that rank's last ``TAIL_LINES`` output lines."""
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
            rank = failed_rank(job.message) if JobState(job.state) is JobState.FAILED else None
            if rank is not None:
                _print_tail(job_id, rank, _rank_tail(args, stub, call, job_id, rank))
            if args.json:
                _emit(args, job, lambda c: None)
            return 0 if JobState(job.state) is JobState.SUCCEEDED else 1
        time.sleep(WAIT_POLL_S)


#: A failed rank's last output lines that ``submit --wait`` prints.
TAIL_LINES = 20
#: Seconds between reads of a failed job's output while its last lines still arrive, and
#: the most spent so: an agent reports a rank's exit, then ships its last lines.
TAIL_SETTLE_S, TAIL_SETTLE_MAX_S = 0.5, 5.0


def _rank_tail(
    args: argparse.Namespace,
    stub: Any,
    call: Callable[[Callable[[], Any]], Any],
    job_id: str,
    rank: int,
) -> list[Any]:
    """The last ``TAIL_LINES`` lines of ``rank``'s output: read to the end, then again
    ``TAIL_SETTLE_S`` later until a read brings nothing new (``TAIL_SETTLE_MAX_S`` at
    most), since an agent ships a rank's last lines after it reports the exit."""
    tail: collections.deque[Any] = collections.deque(maxlen=TAIL_LINES)
    after, deadline = 0, time.monotonic() + TAIL_SETTLE_MAX_S
    waited = arrived = False
    while True:
        request = pb.GetJobLogsRequest(job_id=job_id, after_seq=after)
        resp = call(functools.partial(stub.GetJobLogs, request, timeout=args.timeout))
        if resp.lines:
            tail.extend(line for line in resp.lines if line.rank == rank)
            after, arrived = resp.next_seq, True
            continue  # more pages may be waiting
        if (waited and not arrived) or time.monotonic() >= deadline:
            return list(tail)
        waited, arrived = True, False
        time.sleep(TAIL_SETTLE_S)


def _print_tail(job_id: str, rank: int, lines: Sequence[Any]) -> None:
    """The failed rank's last lines on stderr, under a line that says how to see all."""
    if not lines:
        print(f"rank {rank} left no output (hetero-coord logs {job_id})", file=sys.stderr)
        return
    print(
        f"last {len(lines)} lines of rank {rank} (all: hetero-coord logs {job_id} --rank {rank}):",
        file=sys.stderr,
    )
    for line in lines:
        print(
            f"  [rank {line.rank} {line.stream}] {printable(line.text.rstrip())}", file=sys.stderr
        )
