"""``hetero-agent``: run the node agent, or print this node's hardware profile.

Errors a user can fix print one ``error: ...`` line on stderr and exit non-zero.
"""

from __future__ import annotations

import os

# The agent forks rank processes while gRPC threads run; gRPC's fork handlers only
# print warnings then. Must be set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from hetero.agent import peercli
from hetero.agent.config import AgentConfig, load_config, with_flags
from hetero.core import defaults, heap
from hetero.core.errors import ConfigError, HeteroError
from hetero.core.logs import configure_logging
from hetero.security.auth import AGENT_TOKEN_ENV, TOKEN_ENV
from hetero.security.credentials import check_holder
from hetero.security.permissions import private_dir, refuse_root, seal_secrets, set_daemon_umask
from hetero.security.transport import (
    ServerSecurity,
    add_client_arguments,
    check_listen,
    client_security,
)

EPILOG = """\
examples:
  hetero-agent run --coordinator 10.0.0.1:7070          # the daemon (systemd runs this)
  hetero-agent profile --json                           # measure this node, print, exit
  hetero-agent peer --serve                             # then the line it prints, on another node
  hetero-agent run --emulate-slowdown 3 --name slow-b   # a CPU node made 3x slower (EMULATED)

Flags override /etc/hetero/agent.yaml (or --config FILE). State (profile cache,
rank logs) lives in --state-dir: /var/lib/hetero as root, else ~/.local/state/hetero.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.exit(2, f"error: {self.prog}: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hetero-agent",
        description="Node agent of hetero: profiles this node's devices, reports telemetry, "
        "and runs the training ranks the coordinator places here.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _Parser(add_help=False)
    common.add_argument(
        "--config",
        type=Path,
        help=f"YAML config (default {defaults.AGENT_CONFIG_PATH} if present)",
    )
    common.add_argument("--state-dir", type=Path, help="profile cache and rank logs")
    common.add_argument(
        "--data-dir", type=Path, help="where jobs read data: its disk's read speed is profiled"
    )
    common.add_argument(
        "--coordinator", help=f"coordinator host:port (default {defaults.COORDINATOR_ADDRESS})"
    )
    common.add_argument(
        "--emulate-slowdown",
        type=float,
        metavar="FACTOR",
        help="EMULATED slowdown of this node (demos)",
    )
    common.add_argument("--quick", action="store_true", default=None, help="small, fast profile")
    common.add_argument(
        "--refresh-profile", action="store_true", help="measure again, ignoring the cache"
    )
    common.add_argument(
        "--log-format", choices=defaults.LOG_FORMATS, help="stderr log format (default text)"
    )
    run = sub.add_parser("run", parents=[common], help="run the agent daemon (default)")
    add_client_arguments(run)
    run.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback --local-listen or --metrics-listen without authentication",
    )
    run.add_argument(
        "--allow-root",
        action="store_true",
        default=None,
        help="run ranks even as root (they run as the agent's user; see docs/deploy.md)",
    )
    run.add_argument(
        "--rank-user",
        metavar="NAME",
        help="run every rank as this unprivileged account (the agent must run as root): "
        "a job's code then reads none of the agent's files (docs/deploy.md)",
    )
    run.add_argument("--name", help="node name (default: the hostname)")
    run.add_argument("--address", help="address other nodes reach this node at")
    run.add_argument(
        "--local-listen",
        help=f"host:port for trainers' AgentLocal (default {defaults.AGENT_LOCAL_ADDRESS})",
    )
    run.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve this node's device telemetry as Prometheus /metrics there (default off)",
    )
    run.add_argument("--cpu-threads", type=int, help="threads per CPU rank")
    run.add_argument(
        "--no-peer-probe",
        action="store_false",
        dest="peer_probe",
        default=None,
        help="answer no link probes: the coordinator then measures no links to this node",
    )
    run.add_argument(
        "--peer-probe-port",
        type=int,
        metavar="PORT",
        help="TCP port for other nodes' link probes (default: one the kernel picks)",
    )
    run.add_argument(
        "--stop-grace", type=float, dest="stop_grace_s", help="seconds from SIGTERM to SIGKILL"
    )
    run.add_argument(
        "--watchdog",
        type=float,
        dest="watchdog_s",
        metavar="S",
        help="kill and report a rank that shows no progress for S seconds (default 300)",
    )
    profile = sub.add_parser(
        "profile", parents=[common], help="measure and print this node's profile"
    )
    profile.add_argument("--json", action="store_true", help="print JSON")
    peercli.add_parser(sub)
    return parser


def _config(args: argparse.Namespace) -> AgentConfig:
    flags = {
        "coordinator": args.coordinator,
        "state_dir": args.state_dir,
        "data_dir": args.data_dir,
        "emulate_slowdown": args.emulate_slowdown,
        "quick_profile": args.quick,
        "log_format": args.log_format,
    }
    names: tuple[str, ...] = ("name", "address", "local_listen", "metrics_listen", "cpu_threads")
    names += ("stop_grace_s", "insecure", "allow_root", "watchdog_s", "token_file", "tls_ca")
    names += ("tls_cert", "tls_key", "rank_user", "peer_probe", "peer_probe_port")
    for name in names:
        flags[name] = getattr(args, name, None)
    return with_flags(load_config(args.config), **flags)


def device_notes(suspect: list[str], shared: bool, foreign_percent: float | None) -> str:
    """What a reader must know about a device's figures, in a few words ("" = nothing)."""
    notes = []
    if suspect:
        names = ", ".join(f.removesuffix("_bytes_per_s").replace("_", " ") for f in suspect)
        notes.append(f"SUSPECT {names} (above the device's limits; not scored)")
    if shared:
        notes.append("profiled while shared with other processes")
    if foreign_percent:
        notes.append(
            f"other processes use {foreign_percent:.0f}%: score / {1 + foreign_percent / 100:.2f}"
        )
    return "; ".join(notes)


def disk_read(bytes_per_s: float | None, method: str) -> str:
    """The data disk's read figure for a title, with how the cache was avoided."""
    if bytes_per_s is None:
        return ""
    how = {"o_direct": "O_DIRECT", "fadvise": "cache dropped", "cached": "from the page cache"}
    return f", disk read {bytes_per_s / 1e6:.0f} MB/s ({how.get(method, method)})"


def _profile(config: AgentConfig, refresh: bool) -> Any:
    from hetero.agent.profile import load_or_measure
    from hetero.core.nvml import Nvml

    state = config.resolved_state_dir
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create state directory {state}: {exc.strerror}") from None
    return load_or_measure(
        state, Nvml(), quick=config.quick_profile, refresh=refresh, data_dir=config.data_dir
    )


def _print_profile(profile: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(profile.to_json(), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    emu = (
        f"  [bold]EMULATED slowdown {profile.emulated_slowdown:g}x[/bold]"
        if profile.emulated
        else ""
    )
    t = Table(
        title=f"{profile.cpu_model}, {profile.cpu_count} CPUs, {profile.cpu_gflops:.0f} CPU GFLOP/s"
        f"{disk_read(profile.disk_read_bytes_per_s, profile.disk_read_method)}{emu}"
    )
    for col in (
        "device",
        "kind",
        "matmul TFLOP/s",
        "memory GB/s",
        "H2D GB/s",
        "memory GiB",
        "score",
        "notes",
    ):
        t.add_column(col)

    def gb(x: float | None) -> str:
        return f"{x / 1e9:.1f}" if x else "n/a"

    for d in profile.devices:
        t.add_row(
            f"{d.index}: {d.name}",
            d.kind,
            f"{d.matmul_tflops:.3f}",
            gb(d.memory_bandwidth_bytes_per_s),
            gb(d.host_to_device_bytes_per_s),
            f"{d.memory_bytes / 2**30:.1f}" if d.memory_bytes else "n/a",
            f"{d.compute_score:.3f}",
            device_notes(list(d.suspect), d.shared_while_profiled, d.foreign_utilization_percent),
        )
    Console().print(t)
    took = f"measured in {profile.measured_in_s:.1f} s" if profile.measured_in_s else "from cache"
    print(f"profile {profile.fingerprint} ({took})")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help")):
        args_list.insert(0, "run")  # `hetero-agent --coordinator X` means `run`
    args = _parser().parse_args(args_list)
    try:
        if args.command == "peer":
            return peercli.run(args)
        config = _config(args)
        configure_logging(config.log_format)
        if args.command == "profile":
            from dataclasses import replace

            profile = replace(
                _profile(config, args.refresh_profile), emulated_slowdown=config.emulate_slowdown
            )
            _print_profile(profile, args.json)
            return 0
        return _run(config, args.refresh_profile)
    except HeteroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _run(config: AgentConfig, refresh: bool) -> int:
    from hetero.agent.daemon import Agent
    from hetero.agent.leftovers import RankRecords

    set_daemon_umask()
    # Credentials first: a bad token file fails in a second, not after the profile.
    security = client_security(
        config.token_file,
        config.tls_ca,
        config.tls_cert,
        config.tls_key,
        address=config.coordinator,
    )
    # Read: now out of reach of the ranks, which run as this user (security.permissions).
    seal_secrets((TOKEN_ENV, AGENT_TOKEN_ENV))
    check_holder(security.token, "node", config.node_name)
    if not security.secured and not config.insecure:  # the listen rule, before the profile
        check_listen(config.local_listen, ServerSecurity(), "agent endpoint")
    if config.metrics_listen:  # the library's server checks no token: loopback or --insecure
        check_listen(
            config.metrics_listen, ServerSecurity(insecure=config.insecure), "agent /metrics"
        )
    ranks_as = config.rank_account()
    refuse_root(config.allow_root, rank_user=ranks_as is not None)
    private_dir(config.resolved_state_dir, passable=ranks_as is not None)
    if ranks_as is not None:
        logging.getLogger("hetero.agent").info(
            "ranks run as %s (uid %d, gid %d)", ranks_as.name, ranks_as.uid, ranks_as.gid
        )
    # What a killed predecessor left running goes first: before the profile, which
    # takes seconds and would measure beside it.
    leftovers = RankRecords(config.resolved_state_dir).end_leftovers()
    profile = _profile(config, refresh)
    agent = Agent(config, profile, security=security, leftovers=leftovers)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("hetero.agent").info("received %s, stopping", signal.Signals(signum).name)
        agent.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if config.metrics_listen:
        from hetero.agent.metrics import NodeCollector, serve_metrics

        collector = NodeCollector(config.node_name, agent.profile, agent.telemetry.latest)
        port = serve_metrics(config.metrics_listen, collector).server_address[1]
        host = config.metrics_listen.rpartition(":")[0]
        logging.getLogger("hetero.agent").info("metrics on http://%s:%d/metrics", host, port)
    heap.settle()  # the profile's and start-up's objects out of full collections
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
