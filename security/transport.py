"""How hetero's gRPC servers listen and its clients connect: TLS, mutual TLS, tokens,
message limits, and the rule that no daemon listens beyond loopback unauthenticated.

Server: ``--tls-cert`` and ``--tls-key`` turn on TLS; adding ``--tls-ca``
requires every client to present a certificate signed by that CA (mutual TLS).
A token (``hetero.security.auth``) may be used with or without TLS. A daemon refuses a
listen address other than loopback unless callers must authenticate (token or
mutual TLS), or ``--insecure`` says the network is trusted.

Client: ``--tls-ca`` turns on TLS and is the CA the server's certificate must
chain to (its host name or IP must match the address dialled);
``--tls-cert``/``--tls-key`` add a client certificate for mutual TLS.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from hetero.core.errors import ConfigError, RemoteError, UnreachableError, error_for_status
from hetero.security.auth import (
    AioTokenAuthInterceptor,
    RoleToken,
    Secret,
    TokenAuthInterceptor,
    find_token,
    load_token,
    local_token_path,
)
from hetero.security.bearer import with_token
from hetero.security.guard import AioGuardInterceptor, GuardInterceptor

if TYPE_CHECKING:
    from hetero.security.credentials import NamedCredentials

log = logging.getLogger("hetero.security.transport")

#: Largest request a hetero server accepts, in bytes; larger ones get RESOURCE_EXHAUSTED.
#: Far above any real message (job specs, a 1000-line log batch of 4 KiB lines), far
#: below what would hurt a coordinator parsing it.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
TLS_ENV = {"ca": "HETERO_TLS_CA", "cert": "HETERO_TLS_CERT", "key": "HETERO_TLS_KEY"}


@dataclass(frozen=True)
class TLSFiles:
    """PEM files. Server: cert+key (TLS), plus ca (mutual TLS). Client: ca (TLS), plus
    cert+key (client certificate)."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    @property
    def any(self) -> bool:
        return any(p is not None for p in (self.cert, self.key, self.ca))

    def _pair(self) -> tuple[bytes, bytes] | None:
        if (self.cert is None) != (self.key is None):
            given, missing = (
                ("tls_cert", "tls_key") if self.key is None else ("tls_key", "tls_cert")
            )
            raise ConfigError(f"{given} needs {missing} too")
        if self.cert is None or self.key is None:
            return None
        return _read_pem(self.key, "tls_key"), _read_pem(self.cert, "tls_cert")

    def server_credentials(self) -> grpc.ServerCredentials | None:
        pair = self._pair()
        if pair is None:
            if self.ca is not None:
                raise ConfigError("tls_ca on a server needs tls_cert and tls_key")
            return None
        ca = _read_pem(self.ca, "tls_ca") if self.ca is not None else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        pair = self._pair()
        if self.ca is None:
            if pair is not None:
                raise ConfigError("a client certificate (tls_cert) needs tls_ca too")
            return None
        key, cert = pair if pair is not None else (None, None)
        return grpc.ssl_channel_credentials(
            root_certificates=_read_pem(self.ca, "tls_ca"), private_key=key, certificate_chain=cert
        )


def _read_pem(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {path}: not a PEM file")
    return data


@dataclass(frozen=True)
class ServerSecurity:
    """How a server authenticates callers. ``insecure`` allows a non-loopback address
    with no authentication."""

    token: Secret | None = None
    tls: TLSFiles = field(default_factory=TLSFiles)
    insecure: bool = False
    #: Where ``token`` was generated when none was configured (said in the start-up line).
    generated_token: Path | None = None
    #: Tokens limited to a role's methods, beside ``token`` (which may call anything).
    roles: tuple[RoleToken, ...] = ()
    #: The service itself checks a credential bound to the request (AgentLocal's
    #: per-job tokens), which no interceptor can: counts as authentication.
    checked_by_service: bool = False
    #: Node and user credentials (``hetero.security.credentials``), beside ``token`` and ``roles``.
    named: NamedCredentials | None = None
    #: The service maps a client certificate to a role (``coordinator.scope``): a call
    #: with a certificate and no token passes the token check.
    certificate_callers: bool = False

    @property
    def mutual_tls(self) -> bool:
        return self.tls.ca is not None

    @property
    def authenticated(self) -> bool:
        return (
            self.token is not None
            or bool(self.roles)
            or self.named is not None
            or self.mutual_tls
            or self.checked_by_service
        )

    @property
    def checks_tokens(self) -> bool:
        """Whether calls go through the token interceptor."""
        return self.token is not None or bool(self.roles) or self.named is not None


@dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: a token, and TLS files (TLS is on when ``tls.ca`` is set)."""

    token: Secret | None = None
    tls: TLSFiles = field(default_factory=TLSFiles)
    #: Where the token came from ("token file /etc/hetero/token", "$HETERO_TOKEN"; "" for
    #: none or unknown): what a refused daemon tells the operator to fix.
    token_source: str = ""

    @property
    def secured(self) -> bool:
        return self.token is not None or self.tls.any


def server_security(
    token_file: Path | None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    tls_ca: Path | None = None,
    insecure: bool = False,
) -> ServerSecurity:
    """Read the token (``hetero.security.auth.load_token``) and check the TLS files exist."""
    tls = TLSFiles(tls_cert, tls_key, tls_ca)
    tls.server_credentials()  # fail now, with the file's name, not at bind time
    return ServerSecurity(load_token(token_file), tls, insecure)


def client_security(
    token_file: Path | None,
    tls_ca: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    *,
    address: str | None = None,
) -> ClientSecurity:
    """Read the token and check the TLS files; each TLS path falls back to ``$HETERO_TLS_*``.
    A client of a loopback ``address`` given no token uses the one a local coordinator
    generated (``hetero.security.auth.local_token_path``); it is never sent beyond loopback."""

    def env(path: Path | None, key: str) -> Path | None:
        value = os.environ.get(TLS_ENV[key])
        return path if path is not None else (Path(value) if value else None)

    tls = TLSFiles(env(tls_cert, "cert"), env(tls_key, "key"), env(tls_ca, "ca"))
    tls.channel_credentials()
    local = address is not None and is_loopback(address)
    token, source = find_token(token_file, fallback=local_token_path() if local else None)
    return ClientSecurity(token, tls, source)


# ---- servers -------------------------------------------------------------------------------


def is_loopback(address: str) -> bool:
    """True for ``127.x.x.x:port``, ``[::1]:port``, ``localhost:port`` and unix sockets;
    a wildcard, a LAN address or any other host name is not loopback."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(address: str, security: ServerSecurity, what: str) -> None:
    """Refuse a non-loopback ``address`` for ``what`` unless callers authenticate or
    ``--insecure`` was given; warn when a token would cross the network in clear."""
    if is_loopback(address):
        return
    if not security.authenticated:
        if not security.insecure:
            raise ConfigError(
                f"refusing to serve the {what} on {address} without authentication: give a "
                "token (--token-file or $HETERO_TOKEN_FILE) or mutual TLS (--tls-cert, "
                "--tls-key, --tls-ca), or --insecure on a trusted network"
            )
        log.warning(
            "%s on %s accepts calls from anyone who can reach it (--insecure)", what, address
        )
    elif security.tls.cert is None:
        log.warning("%s on %s: without TLS the token crosses the network in clear", what, address)


def new_server(
    security: ServerSecurity,
    *,
    what: str,
    hint: str,
    max_workers: int,
    thread_name_prefix: str,
) -> grpc.Server:
    """A gRPC server with hetero's interceptors (token check first, then the guard) and
    message limit; ``what``/``hint`` word the UNAUTHENTICATED messages."""
    interceptors: list[grpc.ServerInterceptor] = []
    if security.checks_tokens:
        interceptors.append(
            TokenAuthInterceptor(security.token, what, hint, **_credential_checks(security))
        )
    interceptors.append(GuardInterceptor())
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC sets SO_REUSEPORT by default: a second daemon on a taken port would
            # bind too and silently take half the connections (half the agents).
            ("grpc.so_reuseport", 0),
            # No window growth: HTTP/2's 64 KiB per stream bounds what a caller can
            # make the server buffer before its token is checked (with gRPC's
            # bandwidth-delay probing each stream's window grows to megabytes, and 64
            # unauthenticated 7 MiB calls grew a coordinator by 20-100 MiB). Requests
            # here are control-plane sized; replies use the client's windows.
            ("grpc.http2.bdp_probe", 0),
        ],
    )


def _credential_checks(security: ServerSecurity) -> dict[str, Any]:
    """What the token interceptors check beside the cluster token, one list for the
    thread-pool and the ``grpc.aio`` server alike."""
    return {
        "roles": security.roles,
        "named": security.named,
        "certificate_callers": security.certificate_callers and security.mutual_tls,
    }


def new_aio_server(
    security: ServerSecurity,
    *,
    what: str,
    hint: str,
    max_concurrent_rpcs: int | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> grpc.aio.Server:
    """:func:`new_server` for ``grpc.aio`` (the same interceptors and limit); call it
    on the event loop that will run the server. ``max_concurrent_rpcs``: calls beyond
    it are refused RESOURCE_EXHAUSTED before their request is read (None = no limit);
    ``max_message_bytes``: the largest request and reply."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if security.checks_tokens:
        interceptors.append(
            AioTokenAuthInterceptor(security.token, what, hint, **_credential_checks(security))
        )
    interceptors.append(AioGuardInterceptor())
    return grpc.aio.server(
        interceptors=interceptors,
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second daemon on a taken port would
            # bind too and silently take half the connections (half the agents).
            ("grpc.so_reuseport", 0),
            # No window growth: HTTP/2's 64 KiB per stream bounds what a caller can
            # make the server buffer before its token is checked (with gRPC's
            # bandwidth-delay probing each stream's window grows to megabytes, and 64
            # unauthenticated 7 MiB calls grew a coordinator by 20-100 MiB). Requests
            # here are control-plane sized; replies use the client's windows.
            ("grpc.http2.bdp_probe", 0),
        ],
    )


def bind(
    server: grpc.Server | grpc.aio.Server, address: str, security: ServerSecurity, what: str
) -> int:
    """Check the listen policy, then bind ``address`` (port 0 = any free port); the port."""
    check_listen(address, security, what)
    credentials = security.tls.server_credentials()
    try:
        if credentials is None:
            port = int(server.add_insecure_port(address))
        else:
            port = int(server.add_secure_port(address, credentials))
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {address}: address in use or invalid")
    return port


# ---- clients -------------------------------------------------------------------------------


def client_channel(
    address: str,
    security: ClientSecurity | None = None,
    options: Sequence[tuple[str, int | str]] = (),
) -> grpc.Channel:
    """A channel to ``address``: TLS if ``security.tls.ca``, the token on every call."""
    security = security or ClientSecurity()
    opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *options]
    credentials = security.tls.channel_credentials()
    if credentials is None:
        channel = grpc.insecure_channel(address, options=opts)
    else:
        channel = grpc.secure_channel(address, credentials, options=opts)
    return with_token(channel, security.token)


def remote_error(exc: grpc.RpcError, target: str, *, hint: str = "") -> RemoteError:
    """The ``HeteroError`` for a failed call to ``target`` ("the coordinator at ADDR"),
    ``hint`` ending an unreachable line: this edge only reads the status and details off
    ``exc``; the rule of which status becomes which error is
    ``hetero.core.errors.error_for_status``."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    status = code.name if isinstance(code, grpc.StatusCode) else None
    text = details if isinstance(details, str) else str(exc)
    return error_for_status(status, text, target, hint=hint)


def is_unreachable(exc: grpc.RpcError) -> bool:
    """True if the call failed for want of an answer (retry later), not a refusal."""
    return isinstance(remote_error(exc, "the server"), UnreachableError)


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """``--token-file``, ``--tls-ca``, ``--tls-cert``, ``--tls-key`` for a client command."""
    g = parser.add_argument_group("authentication (see docs/reliability.md#security)")
    g.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="file holding the coordinator's token (else $HETERO_TOKEN_FILE, $HETERO_TOKEN, "
        "else, for a coordinator on loopback, the token it generated in this user's state "
        "directory)",
    )
    g.add_argument(
        "--tls-ca", type=Path, metavar="PEM", help="CA of the server's certificate: turns on TLS"
    )
    g.add_argument("--tls-cert", type=Path, metavar="PEM", help="client certificate (mutual TLS)")
    g.add_argument("--tls-key", type=Path, metavar="PEM", help="client certificate's key")


def client_security_from_args(args: argparse.Namespace) -> ClientSecurity:
    return client_security(
        args.token_file,
        args.tls_ca,
        args.tls_cert,
        args.tls_key,
        address=getattr(args, "coordinator", None),
    )


def describe(security: ServerSecurity | None) -> str:
    """How callers authenticate, for the daemon's start-up log line (never the token)."""
    if security is None:
        return "no authentication"
    token = "token" if security.generated_token is None else f"token in {security.generated_token}"
    parts = [token if security.token is not None else "", "TLS" if security.tls.cert else ""]
    if security.roles:
        parts.append("role tokens")
    if security.named is not None:
        parts.append("node and user credentials")
    if security.mutual_tls:
        parts.append("client certificates")
    named = [p for p in parts if p]
    return " + ".join(named) if named else "no authentication"


def warn_unverified_coordinator(address: str, security: ClientSecurity) -> None:
    """An agent runs what its coordinator orders: say so when nothing proves who that is."""
    if not is_loopback(address) and security.tls.ca is None:
        log.warning(
            "coordinator %s is reached without TLS: its identity is not verified, so anyone "
            "who can impersonate it on the network can run commands here (docs/reliability.md#security)",
            address,
        )
