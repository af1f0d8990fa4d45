"""``hetero-coord``: run the coordinator daemon, and submit and inspect jobs.

The process wiring of the coordinator: argument parsing, logging, and ``serve``,
which starts the daemon from its config file and flags. The user commands
(submit, jobs, ...) are thin gRPC clients in ``hetero.client.commands``. Every failure prints
one ``error: ...`` line on stderr and exits non-zero.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetero.client import commands
from hetero.coordinator import access
from hetero.coordinator.config import CoordinatorConfig, load_config, with_flags
from hetero.coordinator.roles import load_roles
from hetero.core import defaults
from hetero.core.errors import HeteroError
from hetero.core.logs import configure_logging
from hetero.core.textsafe import printable
from hetero.security.auth import ensure_token, local_token_path
from hetero.security.permissions import private_dir, set_daemon_umask
from hetero.security.transport import check_listen, server_security

EPILOG = """\
examples:
  hetero-coord serve                                # gRPC on 127.0.0.1:7070
  hetero-coord submit examples/demo.yaml --dry-run  # validate; show placement and predictions
  hetero-coord submit examples/demo.yaml --wait     # submit and follow to the end
  hetero-coord jobs --json
  hetero-coord jobs --all                           # every job, not only the 100 newest
  hetero-coord job 3f2a9c1b7d4e
  hetero-coord nodes
  hetero-coord cancel 3f2a9c1b7d4e
  hetero-coord drain gpu-node-3                     # no new ranks there; --undo to reverse
  hetero-coord export 3f2a9c1b7d4e --format csv --out stats.csv
  hetero-coord health                               # gRPC health: SERVING, exit 0
  hetero-coord serve --metrics-listen 127.0.0.1:9464  # Prometheus /metrics (loopback)
  hetero-coord db upgrade --db postgresql+psycopg://hetero@db-host/hetero
  hetero-coord node-token gpu-node-3 --out gpu-node-3.token  # that node's credential
  hetero-coord user-token ana                       # ana's: cancels only her own jobs

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
        help="host:port to serve Prometheus /metrics on (default: off); beyond loopback "
        "scrapes must send the token (Authorization: Bearer)",
    )
    auth = serve.add_argument_group("authentication (see docs/reliability.md#security)")
    auth.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require this token on every call (else $HETERO_TOKEN_FILE, $HETERO_TOKEN, else "
        "a token generated into the state directory, mode 0600)",
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
        help="no token at all: allow any caller, on loopback or (trusted networks only) "
        "a non-loopback --listen",
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

    db = sub.add_parser(
        "db",
        help="upgrade the database to this version's schema (serve does it too), or show its revision",
    )
    db.add_argument("action", choices=("upgrade", "current"))
    db.add_argument("--config", type=Path, help="YAML config whose db: and state_dir: are used")
    db.add_argument("--state-dir", type=Path, help="state directory (its SQLite file)")
    db.add_argument(
        "--db", help="SQLAlchemy database URL (default: SQLite file in the state directory)"
    )

    access.add_commands(sub)

    commands.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "db":
            return _db(args)
        if args.command in ("node-token", "user-token"):
            return access.print_credential(args)
        return commands.run(args)
    except HeteroError as exc:
        print(f"error: {printable(str(exc))}", file=sys.stderr)  # may quote a user's text
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


# ---- db -----------------------------------------------------------------------------


def _db(args: argparse.Namespace) -> int:
    from hetero.coordinator.database import connect, prepare
    from hetero.coordinator.dburl import masked
    from hetero.coordinator.schema import current_revision, head
    from hetero.coordinator.standby import Leadership

    config = with_flags(load_config(args.config), state_dir=args.state_dir, db=args.db)
    url = config.db_url
    if config.db is None and not config.resolved_state_dir.is_dir():
        raise HeteroError(f"no state directory {config.resolved_state_dir}: nothing to upgrade")
    engine = connect(url)
    lock = Leadership(engine)
    try:
        if args.action == "upgrade":
            # A coordinator serving this database holds its lock: the schema is not
            # changed under it (SQLite refuses in try_acquire, naming its pid).
            if not lock.try_acquire():
                raise HeteroError(
                    f"a coordinator serves {lock.url}: stop it before upgrading (a newer "
                    "coordinator upgrades its database itself when it starts)"
                )
            prepare(engine)
        have = current_revision(engine)
    finally:
        lock.release()
        engine.dispose()
    shown = masked(engine.url.render_as_string(hide_password=False))
    newest = head()
    state = "head" if have == newest else f"this hetero's head is {newest}"
    print(f"database {shown}: schema revision {have or 'none'} ({state})")
    return 0


# ---- serve --------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from hetero.coordinator.server import Settings, serve
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
    set_daemon_umask()
    configure_logging(config.log_format)
    config.check_private_paths()  # before anything is made: the state, its token
    security = server_security(
        config.token_file, config.tls_cert, config.tls_key, config.tls_ca, config.insecure
    )
    if config.roles:
        security = replace(security, roles=load_roles(config.roles))
    # A listener beyond loopback needs authentication the operator configured (agents on
    # other nodes need a copy of it); checked before the generated token is added.
    check_listen(config.listen, security, "coordinator")
    state_dir = private_dir(config.resolved_state_dir)
    if not (security.authenticated or security.insecure):
        # Secure by default: no unauthenticated listener even on loopback, where every
        # local user could otherwise submit a `command:` job run by the agents.
        token_path = local_token_path(state_dir)
        security = replace(security, token=ensure_token(token_path), generated_token=token_path)
    elif security.insecure and not security.authenticated:
        logging.getLogger("hetero.coordinator").warning(
            "--insecure: no token; every user who can reach %s can submit jobs", config.listen
        )
    # Node and user credentials, beside the token (made after the check above, so they
    # neither stand in for an operator's credential nor stop the token's generation).
    security, certificates = access.with_access(config, security)
    if config.metrics_listen:
        from hetero.coordinator.metricsserver import check_metrics_listen

        check_metrics_listen(config.metrics_listen, security)
    settings = Settings(
        db_url=config.db_url,
        heartbeat_interval_s=config.heartbeat_interval_s,
        heartbeat_timeout_s=config.heartbeat_timeout_s,
        master_port_base=config.master_port_base,
        telemetry=TelemetryPolicy(retention_s=config.telemetry_retention_h * 3600),
        interval_retention=config.interval_retention,
        log_retention=config.log_retention,
        job_retention=config.job_retention,
        limits=config.limits,
        log_caps=config.log_caps,
        allowed_roots=config.resolved_allowed_roots,
        private_paths=tuple(path for _, path in config.private_paths),
    )
    serve(
        config.listen,
        settings,
        grace_s=config.grace_s,
        metrics_listen=config.metrics_listen,
        security=security,
        certificates=certificates,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
