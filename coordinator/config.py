"""The coordinator daemon's configuration: a YAML file overridden by flags.

``/etc/hetero/coordinator.yaml`` is read if it exists (a file named with
``--config`` must exist); every key is optional and flags win over the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from hetero.coordinator.admission import Limits
from hetero.coordinator.database import sqlite_url
from hetero.coordinator.logcaps import MIN_JOB_CAP, LogCaps
from hetero.coordinator.retention import IntervalRetention, JobRetention, LogRetention
from hetero.core import defaults
from hetero.core.defaults import LOG_FORMATS, default_state_dir
from hetero.core.errors import ConfigError
from hetero.core.roots import absolute, check_private, default_roots, normalize_root
from hetero.core.yamlfields import Fields


@dataclass(frozen=True)
class CoordinatorConfig:
    """Seconds for the heartbeat settings, hours and days for retention (as their
    flags); ``db`` None = SQLite under ``state_dir``."""

    listen: str = defaults.COORDINATOR_ADDRESS
    state_dir: Path | None = None
    db: str | None = None
    log_format: str = "text"
    heartbeat_interval_s: float = defaults.HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    grace_s: float = defaults.SHUTDOWN_GRACE_S
    #: host:port for Prometheus /metrics; None = off.
    metrics_listen: str | None = None
    #: Authentication and TLS (docs/reliability.md#security); the token itself is never in the config.
    token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    insecure: bool = False
    #: Token files of the limited roles (``roles.ROLES``: user, agent, read), by role.
    roles: tuple[tuple[str, Path], ...] = ()
    #: The secret node and user credentials are signed with (``hetero.security.credentials``);
    #: None = ``credential-secret`` in the state directory.
    credential_secret_file: Path | None = None
    #: Named credentials no longer accepted ("node:gpu-3", "user:bob").
    revoked: tuple[str, ...] = ()
    #: Client certificates' common names and the role each maps to (``roles.certificate_callers``).
    certificates: tuple[tuple[str, str], ...] = ()
    #: Directories a job's checkpoint.dir and data_dir must lie under; None = the default
    #: of ``core.roots.default_roots``. None may hold one of ``private_paths``.
    allowed_roots: tuple[str, ...] | None = None
    #: First rendezvous port (MASTER_PORT) handed to jobs; each job and restart takes the next.
    master_port_base: int = defaults.MASTER_PORT_BASE
    #: Telemetry kept per node (``store.TelemetryPolicy.retention_s``), in hours.
    telemetry_retention_h: float = 24.0
    #: Interval statistics (``retention.IntervalRetention``): whole for ``_raw_h``
    #: hours, then 1 interval in ``_thin`` of each job, deleted after ``_keep_days``.
    interval_stats_raw_h: float = 24.0
    interval_stats_thin: int = 10
    interval_stats_keep_days: float = 30.0
    #: Rank log lines (``retention.LogRetention``): deleted after ``log_keep_days``, at
    #: most ``log_lines_per_job`` a job (oldest first); events after ``event_keep_days``.
    log_keep_days: float = 7.0
    log_lines_per_job: int = 200_000
    event_keep_days: float = 30.0
    #: Finished jobs (``retention.JobRetention``): deleted with all their rows this many
    #: days after they finished.
    job_keep_days: float = 30.0
    #: Byte caps on stored log lines (``logcaps.LogCaps``): per job, per user, in all.
    log_caps: LogCaps = field(default_factory=LogCaps)
    #: Admission (``admission.Limits``): the queue and the server's limits.
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError(
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s:g}) must exceed "
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g})"
            )

        for root in self.allowed_roots or ():
            if not Path(root).expanduser().is_absolute():
                raise ConfigError(f"allowed_roots: {root!r} must be an absolute path")
        if not (math.isfinite(self.telemetry_retention_h) and self.telemetry_retention_h >= 1 / 60):
            raise ConfigError(
                f"telemetry_retention_h must be at least 1/60 (a minute), "
                f"got {self.telemetry_retention_h:g}"
            )
        _ = self.interval_retention  # built now so a bad value fails at startup, by its key
        _ = self.log_retention
        _ = self.job_retention

    @property
    def resolved_state_dir(self) -> Path:
        return self.state_dir or default_state_dir()

    @property
    def resolved_credential_secret(self) -> Path:
        # Imported here: hetero.security.credentials loads grpc, which this module must not.
        from hetero.security.credentials import secret_path

        return secret_path(self.credential_secret_file, self.resolved_state_dir)

    @property
    def resolved_allowed_roots(self) -> tuple[str, ...]:
        if self.allowed_roots is None:
            return default_roots(self.resolved_state_dir)
        return tuple(normalize_root(r) for r in self.allowed_roots)

    @property
    def private_paths(self) -> tuple[tuple[str, str], ...]:
        """What no job may reach, each with what it is (``core.roots.absolute`` paths):
        the state directory (database, generated token, credential secret) and each of
        those, the token files and the TLS key where they are configured elsewhere."""
        found: list[tuple[str, Path | None]] = [
            ("state directory", self.resolved_state_dir),
            ("credential secret", self.resolved_credential_secret),
            ("token file", self.token_file),
            ("TLS key", self.tls_key),
            *((f"{role} token file", path) for role, path in self.roles),
        ]
        if self.db is not None and self.db.startswith("sqlite"):  # else: in the state dir
            try:
                file = make_url(self.db).database
            except ArgumentError:
                file = None  # opening the database says what is wrong with the URL
            if file and file != ":memory:":
                found.append(("database", Path(file)))
        return tuple((what, absolute(path)) for what, path in found if path is not None)

    def check_private_paths(self) -> None:
        """A one-line ``ConfigError`` if an allowed root holds one of ``private_paths``."""
        check_private(self.private_paths, self.resolved_allowed_roots)

    @property
    def interval_retention(self) -> IntervalRetention:
        return IntervalRetention(
            raw_s=self.interval_stats_raw_h * 3600,
            thin_every=self.interval_stats_thin,
            keep_s=self.interval_stats_keep_days * 86400,
        )

    @property
    def log_retention(self) -> LogRetention:
        return LogRetention(
            logs_keep_s=self.log_keep_days * 86400,
            lines_per_job=self.log_lines_per_job,
            events_keep_s=self.event_keep_days * 86400,
        )

    @property
    def job_retention(self) -> JobRetention:
        return JobRetention(keep_s=self.job_keep_days * 86400)

    @property
    def db_url(self) -> str:
        return self.db or sqlite_url(self.resolved_state_dir)


def load_config(path: Path | None) -> CoordinatorConfig:
    """The config file's settings (defaults if ``path`` is None and the default file is absent)."""
    f = Fields.read_config(path, defaults.COORDINATOR_CONFIG_PATH)
    if f is None:
        return CoordinatorConfig()
    d = CoordinatorConfig()
    state_dir = f.string("state_dir")
    secret_file, revoked = _credentials(f.mapping("credentials"))
    config = CoordinatorConfig(
        listen=f.string("listen", d.listen) or d.listen,
        state_dir=Path(state_dir).expanduser() if state_dir else None,
        db=f.string("db"),
        log_format=f.choice("log_format", LOG_FORMATS, "text") or "text",
        heartbeat_interval_s=f.number("heartbeat_interval_s", d.heartbeat_interval_s, positive=True)
        or d.heartbeat_interval_s,
        heartbeat_timeout_s=f.number("heartbeat_timeout_s", d.heartbeat_timeout_s, positive=True)
        or d.heartbeat_timeout_s,
        grace_s=f.number("grace_s", d.grace_s, minimum=0.0) or 0.0,
        metrics_listen=f.string("metrics_listen"),
        token_file=f.path("token_file"),
        tls_cert=f.path("tls_cert"),
        tls_key=f.path("tls_key"),
        tls_ca=f.path("tls_ca"),
        insecure=f.boolean("insecure", False),
        roles=_role_files(f.mapping("roles")),
        credential_secret_file=secret_file,
        revoked=revoked,
        certificates=_certificates(f.mapping("certificates")),
        allowed_roots=f.strings("allowed_roots"),
        master_port_base=f.integer("master_port_base", d.master_port_base, minimum=1024)
        or d.master_port_base,
        telemetry_retention_h=f.number("telemetry_retention_h", 24.0, positive=True) or 24.0,
        interval_stats_raw_h=f.number("interval_stats_raw_h", 24.0, positive=True) or 24.0,
        interval_stats_thin=f.integer("interval_stats_thin", 10, minimum=1) or 10,
        interval_stats_keep_days=f.number("interval_stats_keep_days", 30.0, positive=True) or 30.0,
        log_keep_days=f.number("log_keep_days", d.log_keep_days, positive=True) or 7.0,
        log_lines_per_job=f.integer("log_lines_per_job", d.log_lines_per_job, minimum=1000)
        or d.log_lines_per_job,
        event_keep_days=f.number("event_keep_days", d.event_keep_days, positive=True) or 30.0,
        job_keep_days=f.number("job_keep_days", d.job_keep_days, positive=True) or 30.0,
        log_caps=_log_caps(f),
        limits=_limits(f.mapping("limits")),
    )
    f.finish()
    return config


def _limits(f: Fields | None) -> Limits:
    """``limits: {jobs_per_user, ranks_per_cpu_device, max_spec_bytes, concurrent_rpcs,
    max_message_bytes}``: each optional, each an integer (``admission.Limits``)."""
    d = Limits()
    if f is None:
        return d
    values = {
        key: f.integer(key, getattr(d, key), minimum=1) or getattr(d, key)
        for key in (
            "jobs_per_user",
            "ranks_per_cpu_device",
            "max_spec_bytes",
            "concurrent_rpcs",
            "max_message_bytes",
        )
    }
    f.finish()
    try:
        return Limits(**values)
    except ConfigError as exc:
        raise ConfigError(f"limits: {exc}") from None


def _log_caps(f: Fields) -> LogCaps:
    """``log_bytes_per_job``, ``log_bytes_per_user``, ``log_bytes_total``: each optional,
    each a whole number of bytes (``logcaps.LogCaps``)."""
    d, least = LogCaps(), MIN_JOB_CAP
    return LogCaps(
        per_job=f.integer("log_bytes_per_job", d.per_job, minimum=least) or d.per_job,
        per_user=f.integer("log_bytes_per_user", d.per_user, minimum=least) or d.per_user,
        total=f.integer("log_bytes_total", d.total, minimum=least) or d.total,
    )


def _role_files(f: Fields | None) -> tuple[tuple[str, Path], ...]:
    """``roles: {user: FILE, agent: FILE, read: FILE}``: each optional, each a token file."""
    if f is None:
        return ()
    files = tuple((role, f.path(role)) for role in ("user", "agent", "read"))
    f.finish()
    return tuple((role, path) for role, path in files if path is not None)


def _credentials(f: Fields | None) -> tuple[Path | None, tuple[str, ...]]:
    """``credentials: {secret_file: FILE, revoked: [node:NAME, user:NAME, ...]}``."""
    if f is None:
        return None, ()
    secret_file, revoked = f.path("secret_file"), f.strings("revoked") or ()
    f.finish()
    return secret_file, revoked


def _certificates(f: Fields | None) -> tuple[tuple[str, str], ...]:
    """``certificates: {COMMON_NAME: ROLE}``: each value a role name (``roles.certificate_callers``)."""
    if f is None:
        return ()
    mapping = tuple((cn, f.string(cn) or "") for cn in f.names())
    f.finish()
    return mapping


def with_flags(config: CoordinatorConfig, **flags: object) -> CoordinatorConfig:
    """``config`` with every flag that was given (not None) applied."""
    given = {k: v for k, v in flags.items() if v is not None}
    return replace(config, **given)  # type: ignore[arg-type]
