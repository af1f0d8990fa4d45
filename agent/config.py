"""The agent daemon's configuration: ``/etc/hetero/agent.yaml`` overridden by flags.

Every key is optional; unknown keys are errors with a "did you mean" hint.
The YAML reader and the shared defaults are ``hetero.core``'s.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from hetero.agent.ranklog import KEEP, MAX_BYTES, RankLogLimits
from hetero.core import defaults
from hetero.core.defaults import LOG_FORMATS, default_state_dir
from hetero.core.errors import ConfigError
from hetero.core.roots import absolute
from hetero.core.yamlfields import Fields
from hetero.security.permissions import RankUser, rank_user


@dataclass(frozen=True)
class AgentConfig:
    """Seconds for every ``*_s``. ``None`` means "work it out at start"."""

    coordinator: str = defaults.COORDINATOR_ADDRESS
    #: Node name registered with the coordinator (default: the hostname).
    name: str | None = None
    #: Address other nodes reach this node at (MASTER_ADDR when rank 0 runs here).
    address: str | None = None
    #: Where the agent serves AgentLocal to its trainers.
    local_listen: str = defaults.AGENT_LOCAL_ADDRESS
    #: host:port for this node's Prometheus /metrics (``agent.metrics``); None = off.
    metrics_listen: str | None = None
    state_dir: Path | None = None
    #: Where this node's jobs read their data: the profile times its disk's sequential
    #: read (``agent.diskprobe``). ``None``: the state directory's disk.
    data_dir: Path | None = None
    log_format: str = "text"
    #: Emulated slowdown of every device of this node (1 = none; demos and tests only).
    emulate_slowdown: float = 1.0
    #: Threads per CPU rank (default: the node's cores divided among its CPU ranks).
    cpu_threads: int | None = None
    #: Small, fast profile (a second or two on CPU) instead of the full one.
    quick_profile: bool = False
    #: Seconds a stopped rank gets between SIGTERM and SIGKILL.
    stop_grace_s: float = 10.0
    #: Python interpreter for built-in jobs (``hetero-train``).
    python: str = sys.executable
    #: Authentication and TLS toward the coordinator (docs/reliability.md#security).
    token_file: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: Allow a non-loopback local_listen or metrics_listen without authentication.
    insecure: bool = False
    #: Run ranks even when the agent is root (they run as the agent's user).
    allow_root: bool = False
    #: An unprivileged account every rank runs as (the agent must run as root): ranks
    #: then read none of the agent's files. None: ranks run as the agent's user.
    rank_user: str | None = None
    #: Seconds a rank may go without progress (a step, an output line) before the
    #: agent kills it and reports it failed. Generous: loading data or a checkpoint,
    #: or the ideal measurement after training, shows no step progress.
    watchdog_s: float = 300.0
    #: Size of one rank log file before it rotates, in bytes, and rotated files kept:
    #: a rank holds at most ``rank_log_max_bytes * (rank_log_keep + 1)`` bytes of disk.
    rank_log_max_bytes: int = MAX_BYTES
    rank_log_keep: int = KEEP
    #: Answer other nodes' link probes, so the coordinator can measure the links a job
    #: across this node crosses (``agent.peerlinks``); on ``peer_probe_port`` (0: one
    #: the kernel picks, for a firewall that opens a range or none).
    peer_probe: bool = True
    peer_probe_port: int = 0

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
        if not 1.0 <= self.emulate_slowdown <= 100.0:
            raise ConfigError(
                f"emulate_slowdown must be in [1, 100], got {self.emulate_slowdown:g}"
            )
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
        if not self.watchdog_s > 0:
            raise ConfigError(f"watchdog_s must be > 0, got {self.watchdog_s:g}")
        RankLogLimits(self.rank_log_max_bytes, self.rank_log_keep)  # raises if out of range
        if not 0 <= self.peer_probe_port <= 65535:
            raise ConfigError(f"peer_probe_port must be in [0, 65535], got {self.peer_probe_port}")
        if self.stop_grace_s < 0:
            raise ConfigError(f"stop_grace_s must be >= 0, got {self.stop_grace_s:g}")
        for key in ("coordinator", "local_listen"):
            value = getattr(self, key)
            if ":" not in value:
                raise ConfigError(f"{key} must be host:port, got {value!r}")
        if self.metrics_listen is not None and not _host_port(self.metrics_listen):
            raise ConfigError(f"metrics_listen must be host:port, got {self.metrics_listen!r}")

    def rank_account(self) -> RankUser | None:
        """The ``rank_user`` account; ``ConfigError`` if it cannot be used here."""
        return rank_user(self.rank_user) if self.rank_user else None

    @property
    def rank_logs(self) -> RankLogLimits:
        return RankLogLimits(self.rank_log_max_bytes, self.rank_log_keep)

    @property
    def resolved_state_dir(self) -> Path:
        return self.state_dir or default_state_dir()

    @property
    def private_paths(self) -> tuple[tuple[str, str], ...]:
        """What no job may reach, each with what it is (``core.roots.absolute`` paths):
        the state directory (rank records, its rank logs, the local token) and the token
        file and TLS key where they are configured elsewhere."""
        found = [
            ("agent state directory", self.resolved_state_dir),
            ("agent token file", self.token_file),
            ("agent TLS key", self.tls_key),
        ]
        return tuple((what, absolute(path)) for what, path in found if path is not None)

    @property
    def node_name(self) -> str:
        return self.name or socket.gethostname()


def _host_port(address: str) -> bool:
    _host, sep, port = address.rpartition(":")
    return bool(sep) and port.isdigit()


def load_config(path: Path | None) -> AgentConfig:
    """The file's settings; defaults if ``path`` is None and the default file is absent."""
    f = Fields.read_config(path, defaults.AGENT_CONFIG_PATH)
    if f is None:
        return AgentConfig()
    d = AgentConfig()
    state_dir = f.string("state_dir")
    data_dir = f.string("data_dir")
    config = AgentConfig(
        coordinator=f.string("coordinator", d.coordinator) or d.coordinator,
        name=f.string("name"),
        address=f.string("address"),
        local_listen=f.string("local_listen", d.local_listen) or d.local_listen,
        metrics_listen=f.string("metrics_listen"),
        state_dir=Path(state_dir).expanduser() if state_dir else None,
        data_dir=Path(data_dir).expanduser() if data_dir else None,
        log_format=f.choice("log_format", LOG_FORMATS, "text") or "text",
        emulate_slowdown=f.number("emulate_slowdown", 1.0, minimum=1.0) or 1.0,
        cpu_threads=f.integer("cpu_threads", None, minimum=1),
        quick_profile=f.boolean("quick_profile", False),
        stop_grace_s=f.number("stop_grace_s", d.stop_grace_s, minimum=0.0) or 0.0,
        python=f.string("python", sys.executable) or sys.executable,
        token_file=f.path("token_file"),
        tls_ca=f.path("tls_ca"),
        tls_cert=f.path("tls_cert"),
        tls_key=f.path("tls_key"),
        insecure=f.boolean("insecure", False),
        allow_root=f.boolean("allow_root", False),
        rank_user=f.string("rank_user"),
        watchdog_s=f.number("watchdog_s", d.watchdog_s, positive=True) or d.watchdog_s,
        rank_log_max_bytes=f.integer("rank_log_max_bytes", MAX_BYTES, minimum=4096) or MAX_BYTES,
        rank_log_keep=f.integer("rank_log_keep", KEEP, minimum=1) or KEEP,
        peer_probe=f.boolean("peer_probe", True),
        peer_probe_port=f.integer("peer_probe_port", 0, minimum=0) or 0,
    )
    f.finish()
    return config


def with_flags(config: AgentConfig, **flags: object) -> AgentConfig:
    """``config`` with every flag that was given (not None) applied."""
    given = {k: v for k, v in flags.items() if v is not None}
    return replace(config, **given)  # type: ignore[arg-type]


def outbound_address(coordinator: str) -> str:
    """The local IP address this node uses to reach ``coordinator`` (no packet is sent)."""
    host = coordinator.rsplit(":", 1)[0].strip("[]")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()
