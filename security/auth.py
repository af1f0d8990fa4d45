"""Bearer-token authentication for hetero's gRPC services: tokens and the server side
(the client side, a channel that sends the token, is ``hetero.security.bearer``).

Every RPC of the coordinator and of the agent's ``AgentLocal`` endpoint carries
``authorization: Bearer <token>`` metadata when the daemon has a token; the
server interceptor compares it in constant time (``hmac.compare_digest``) and
answers UNAUTHENTICATED with a one-line reason otherwise. The standard health
service stays open (liveness probes and load balancers carry no credentials;
it reveals only "serving"); reflection and every hetero RPC need the token.

Where a token comes from, first match wins: a file named by ``--token-file`` or
the config key ``token_file``; the file named by ``$HETERO_TOKEN_FILE`` (what
the systemd units set, pointing into ``$CREDENTIALS_DIRECTORY``); the value of
``$HETERO_TOKEN`` (an ``EnvironmentFile``). A coordinator given none of these
generates one into its state directory (``ensure_token``, mode 0600), and a
client dialling a loopback address reads it from this user's state directory
(``local_token_path``): secure by default, with nothing to configure on one
machine. The token is held in a
:class:`Secret`, whose ``repr`` and ``str`` are masked, so it cannot reach a
log line, an error message or the database by accident.

The agent never hands the coordinator's token to the ranks it launches: it
makes a fresh secret for its own ``AgentLocal`` endpoint at start and gives each
rank the token of its job (:class:`JobTokens`) as ``$HETERO_AGENT_TOKEN``
(environment, not argv); ``AgentLocal`` answers a call only for that job.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import grpc.aio

from hetero.core.defaults import default_state_dir
from hetero.core.errors import ConfigError

if TYPE_CHECKING:
    from hetero.security.credentials import NamedCredentials

log = logging.getLogger("hetero.security.auth")

TOKEN_ENV = "HETERO_TOKEN"
TOKEN_FILE_ENV = "HETERO_TOKEN_FILE"
#: Name of the token a coordinator generates in its state directory when given none.
TOKEN_FILE_NAME = "token"
#: The agent's own endpoint token, given to the ranks it launches.
AGENT_TOKEN_ENV = "HETERO_AGENT_TOKEN"
#: Variables a launched rank must not inherit from its agent (credentials and their paths).
CREDENTIAL_ENV = (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    "CREDENTIALS_DIRECTORY",
    "HETERO_TLS_CA",
    "HETERO_TLS_CERT",
    "HETERO_TLS_KEY",
)
#: Shortest token accepted: 16 characters of a random token are ~96 bits.
MIN_TOKEN_CHARS = 16
METADATA_KEY = "authorization"
SCHEME = "Bearer"
#: Methods served without a token (gRPC's standard health checks).
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
#: Seconds between two log lines about rejected calls (a scanner must not flood the journal).
REJECTION_LOG_PERIOD_S = 60.0


class Secret:
    """A credential whose ``repr``/``str`` never show it; ``reveal()`` is the one way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def matches(self, presented: str) -> bool:
        """Constant-time comparison (for equal lengths) with a presented token."""
        return hmac.compare_digest(presented.encode("utf-8"), self._value.encode("utf-8"))

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is not pickled")


def new_token() -> Secret:
    """A fresh random token (256 bits, URL-safe)."""
    return Secret(secrets.token_urlsafe(32))


def check_token(value: str, where: str) -> Secret:
    """``value`` stripped of surrounding whitespace, as a :class:`Secret`; ``where`` names
    its source in errors, which never contain the token itself."""
    token = value.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{where}: token has {len(token)} characters, need at least {MIN_TOKEN_CHARS} "
            "(make one with: openssl rand -hex 32)"
        )
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise ConfigError(f"{where}: token must be printable ASCII without spaces")
    return Secret(token)


def read_token_file(path: Path) -> Secret:
    """The token in ``path``; a file other users can read is logged once as a warning."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"token file {path}: not UTF-8 text") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s is readable by other users (chmod 600 it)", path)
    return check_token(text, f"token file {path}")


def load_token(
    path: Path | None,
    environ: Mapping[str, str] | None = None,
    fallback: Path | None = None,
) -> Secret | None:
    """The token from ``path``, else ``$HETERO_TOKEN_FILE``, else ``$HETERO_TOKEN``, else
    the file ``fallback`` if it exists and this user may read it, else None."""
    return find_token(path, environ, fallback)[0]


def find_token(
    path: Path | None,
    environ: Mapping[str, str] | None = None,
    fallback: Path | None = None,
) -> tuple[Secret | None, str]:
    """:func:`load_token`'s token and where it came from, said for a person who must fix
    a refused one ("token file /etc/hetero/token", "$HETERO_TOKEN"; "" for none)."""
    env = os.environ if environ is None else environ
    if path is not None:
        return read_token_file(path), f"token file {path}"
    if env.get(TOKEN_FILE_ENV):
        named = Path(env[TOKEN_FILE_ENV])
        return read_token_file(named), f"${TOKEN_FILE_ENV} ({named})"
    if env.get(TOKEN_ENV):
        return check_token(env[TOKEN_ENV], f"${TOKEN_ENV}"), f"${TOKEN_ENV}"
    if fallback is not None and os.access(fallback, os.R_OK):
        return read_token_file(fallback), f"the local coordinator's token file {fallback}"
    return None, ""


def local_token_path(state_dir: Path | None = None) -> Path:
    """Where a coordinator with no configured token keeps the one it generated:
    ``token`` in its state directory (default: this user's, ``default_state_dir``)."""
    return (state_dir or default_state_dir()) / TOKEN_FILE_NAME


def ensure_token(path: Path) -> Secret:
    """The token in ``path``, made first (256 random bits, mode 0600, never replaced) if
    the file does not exist: what a coordinator started without a token uses, so that
    a local client of the same user reads it and nobody else can call. Written to a
    temporary file and linked into place, so a concurrent reader never sees it half
    written and of two concurrent writers the first wins."""
    if path.exists():
        return read_token_file(path)
    token = new_token()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)  # mode 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token.reveal() + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            return read_token_file(path)
        finally:
            os.unlink(tmp)
    except OSError as exc:
        raise ConfigError(f"cannot create token file {path}: {exc.strerror}") from None
    return token


class JobTokens:
    """Per-job credentials an agent mints for its ranks: ``for_job(j)`` is
    HMAC-SHA256(agent secret, j), so the agent keeps no table, a rank's token is good
    for its own job only, and neither reveals the agent's secret or another job's token."""

    __slots__ = ("_secret",)

    def __init__(self, secret: Secret) -> None:
        self._secret = secret

    def for_job(self, job_id: str) -> Secret:
        key = self._secret.reveal().encode("utf-8")
        return Secret(hmac.new(key, job_id.encode("utf-8"), hashlib.sha256).hexdigest())

    def matches(self, job_id: str, metadata: Iterable[tuple[str, Any]] | None) -> bool:
        """Whether ``metadata`` carries the bearer token of ``job_id``."""
        scheme, _, value = (_presented(metadata) or "").partition(" ")
        return scheme.lower() == SCHEME.lower() and self.for_job(job_id).matches(value.strip())

    def __reduce__(self) -> NoReturn:
        raise TypeError("job tokens are not pickled")


def agent_token_from_env(environ: Mapping[str, str] | None = None) -> Secret | None:
    """The agent endpoint's token a rank was launched with (``$HETERO_AGENT_TOKEN``)."""
    value = (os.environ if environ is None else environ).get(AGENT_TOKEN_ENV, "").strip()
    return Secret(value) if value else None


def scrub_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without hetero's credential variables: what a launched rank inherits."""
    return {k: v for k, v in environ.items() if k not in CREDENTIAL_ENV}


# ---- server side ------------------------------------------------------------------------


def _presented(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == METADATA_KEY:
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


def bearer(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The bearer token a call's ``metadata`` presents, or None."""
    scheme, _, value = (_presented(metadata) or "").partition(" ")
    return value.strip() if scheme.lower() == SCHEME.lower() and value.strip() else None


@dataclass(frozen=True)
class RoleToken:
    """A token that may call only ``methods`` (full gRPC names, ``/pkg.Service/Method``):
    a role such as "read" or "agent" (docs/deploy.md#roles). ``role`` names it in
    PERMISSION_DENIED messages; the token never appears in them."""

    role: str
    token: Secret
    methods: frozenset[str]


#: Why a call is refused: its status code and one-line message.
Refusal = tuple[grpc.StatusCode, str]


def _denied(handler: grpc.RpcMethodHandler | None, refusal: Refusal) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that fails with ``refusal`` before reading the
    request (no deserializer: an unauthenticated message is never parsed)."""
    code, message = refusal

    def deny(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, message)

    if handler is not None and handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler is not None and handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler is not None and handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


class TokenAuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """Require ``authorization: Bearer <token>`` on every method but the health checks.

    ``what`` names the service in messages ("coordinator", "agent endpoint");
    ``hint`` tells the caller where its token comes from.
    """

    def __init__(
        self,
        token: Secret | None,
        what: str,
        hint: str,
        *,
        roles: Sequence[RoleToken] = (),
        named: NamedCredentials | None = None,
        certificate_callers: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token = token
        self._roles = tuple(roles)
        self._named = named
        #: A call with no token passes: the service maps its client certificate to a role.
        self._certificate_callers = certificate_callers
        self.missing = f"unauthenticated: the {what} requires a token ({hint})"
        self.wrong = f"unauthenticated: the {what} did not accept the token ({hint})"
        self._clock = clock
        self._lock = threading.Lock()
        self._last_logged = -REJECTION_LOG_PERIOD_S
        self._unlogged: collections.Counter[str] = collections.Counter()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        reason = self.refusal(details)
        handler = continuation(details)
        return handler if reason is None else _denied(handler, reason)

    def refusal(self, details: grpc.HandlerCallDetails) -> Refusal | None:
        """None if the call may proceed, else its status and message (logged): the
        cluster token may call anything, a role's token or a named credential
        (``hetero.security.credentials``) only its methods."""
        if details.method in OPEN_METHODS:
            return None
        presented = _presented(details.invocation_metadata)
        if presented is None and self._certificate_callers:
            return None
        if presented is not None:
            scheme, _, raw = presented.partition(" ")
            value = raw.strip() if scheme.lower() == SCHEME.lower() else None
            if value is not None and self._token is not None and self._token.matches(value):
                return None
            # Every role's token is compared, so the time taken tells nothing of which matched.
            matched = [r for r in self._roles if value is not None and r.token.matches(value)]
            who = self._named.verify(value) if self._named and value is not None else None
            if who is not None and self._named is not None:
                if self._named.may_call(who, details.method):
                    return None
                self._log_rejection(details.method, who.label)
                name = details.method.rsplit("/", 1)[-1]
                return (
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"permission denied: {who.label} may not call {name}",
                )
            if matched:
                role = matched[0]
                if details.method in role.methods:
                    return None
                name = details.method.rsplit("/", 1)[-1]
                self._log_rejection(details.method, f"{role.role} token")
                return (
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"permission denied: the {role.role} token may not call {name}",
                )
        self._log_rejection(details.method, "no token" if presented is None else "wrong token")
        message = self.missing if presented is None else self.wrong
        return grpc.StatusCode.UNAUTHENTICATED, message

    def _log_rejection(self, method: str, why: str) -> None:
        with self._lock:
            self._unlogged[f"{method} ({why})"] += 1
            now = self._clock()
            if now - self._last_logged < REJECTION_LOG_PERIOD_S:
                return
            self._last_logged = now
            summary = ", ".join(f"{n}x {k}" for k, n in self._unlogged.most_common(5))
            self._unlogged.clear()
        log.warning("rejected unauthenticated calls: %s", summary)


class AioTokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """:class:`TokenAuthInterceptor` for a ``grpc.aio`` server: the same check and
    messages, an ``async`` refusal."""

    def __init__(
        self,
        token: Secret | None,
        what: str,
        hint: str,
        *,
        roles: Sequence[RoleToken] = (),
        named: NamedCredentials | None = None,
        certificate_callers: bool = False,
    ) -> None:
        self._check = TokenAuthInterceptor(
            token, what, hint, roles=roles, named=named, certificate_callers=certificate_callers
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        reason = self._check.refusal(details)
        handler = await continuation(details)
        return handler if reason is None else _denied_async(handler, reason)


def _denied_async(handler: grpc.RpcMethodHandler | None, refusal: Refusal) -> grpc.RpcMethodHandler:
    """:func:`_denied` with coroutine handlers, as a ``grpc.aio`` server calls them.

    Every refusal is a request-*streaming* handler that never reads its requests, also
    for a unary method: gRPC reads a unary request whole before calling the handler,
    so 64 unauthenticated 7 MiB messages grew a coordinator by 470 MiB (350 MiB kept)
    before each was refused. A streaming handler runs once the headers arrive; its
    status ends the call and the body is never buffered past HTTP/2's flow-control
    window. (gRPC has no per-caller message limit that could do this instead.)"""
    code, message = refusal

    async def deny(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    async def deny_stream(
        _requests: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await context.abort(code, message)
        yield  # pragma: no cover - abort raises

    if handler is not None and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny_stream)
    return grpc.stream_unary_rpc_method_handler(deny)
