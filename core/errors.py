"""The one error hierarchy. Every user-facing failure is a ``HeteroError``.

Edges translate it: the CLI prints ``error: <message>`` on one line and exits
non-zero, the gRPC layer aborts with ``code`` and the message, the TUI shows a
notification. A ``HeteroError`` is never a programming error: those stay
ordinary exceptions with tracebacks.
"""

from __future__ import annotations


class HeteroError(Exception):
    """Base class of every error a user can cause or fix."""

    #: Name of a ``grpc.StatusCode`` member the gRPC edge maps this error to.
    grpc_code: str = "FAILED_PRECONDITION"
    #: Process exit status used by the CLIs.
    exit_code: int = 1


class ConfigError(HeteroError):
    """A bad flag, job spec or configuration value; the message names the field."""

    grpc_code = "INVALID_ARGUMENT"
    exit_code = 2


class PlanError(HeteroError):
    """A batch-size plan that cannot satisfy its constraints."""

    grpc_code = "FAILED_PRECONDITION"


class CheckpointError(HeteroError):
    """A checkpoint that is missing, unreadable or from an incompatible run."""

    grpc_code = "FAILED_PRECONDITION"


class Stopped(HeteroError):
    """The job stopped on SIGTERM with its state checkpointed: not a failure. The status
    is 128 + SIGTERM, what schedulers and the agent read as terminated
    (``hetero.trainer.drain``)."""

    exit_code = 143


class DistributedError(HeteroError):
    """A process-group failure: a dead peer, a timed-out collective."""

    grpc_code = "UNAVAILABLE"


# ---- what a client raises for a failed call ----------------------------------------------


class RemoteError(HeteroError):
    """A request a server (the coordinator, an agent) refused; the message is its
    one-line reason. ``status`` is the gRPC status's name as received."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status if status is not None else self.grpc_code


class UnreachableError(RemoteError):
    """The server did not answer in time, or is down: retry later."""

    grpc_code = "UNAVAILABLE"
    exit_code = 3


class InvalidRequestError(RemoteError):
    """The server found a value in the request wrong (a job spec, a field, a range)."""

    grpc_code = "INVALID_ARGUMENT"
    exit_code = 2


class UnknownNameError(RemoteError):
    """The server does not know the job, node or rank named (a typo, or its database
    was reset: an agent registers again)."""

    grpc_code = "NOT_FOUND"


class DeniedError(RemoteError):
    """The server refused the caller: a token or certificate missing or wrong."""

    grpc_code = "PERMISSION_DENIED"


class UnsupportedError(RemoteError):
    """The server does not have this call (an older version): the caller does without."""

    grpc_code = "UNIMPLEMENTED"


#: The client-side rule, written once: the error each gRPC status (by name) becomes.
#:
#: - no status at all, ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``: ``UnreachableError``
#:   (exit 3), "cannot reach <target> (<details>)"; the caller may retry, and an
#:   agent keeps what it wanted to send;
#: - ``INVALID_ARGUMENT``, ``OUT_OF_RANGE``: ``InvalidRequestError`` (exit 2, as a bad
#:   flag or job spec given locally);
#: - ``NOT_FOUND``: ``UnknownNameError``;
#: - ``UNAUTHENTICATED``, ``PERMISSION_DENIED``: ``DeniedError``;
#: - ``UNIMPLEMENTED``: ``UnsupportedError``;
#: - any other (``FAILED_PRECONDITION``, ``ALREADY_EXISTS``, ``RESOURCE_EXHAUSTED``,
#:   ``INTERNAL``, ``CANCELLED`` ...): ``RemoteError`` (exit 1).
#:
#: Every refusal's message is the server's own one-line reason (its ``HeteroError``
#: message: the server's edge sends ``grpc_code`` with it, so the class a server raises
#: and the class its client raises share a status).
STATUS_ERRORS: dict[str, type[RemoteError]] = {
    "UNAVAILABLE": UnreachableError,
    "DEADLINE_EXCEEDED": UnreachableError,
    "INVALID_ARGUMENT": InvalidRequestError,
    "OUT_OF_RANGE": InvalidRequestError,
    "NOT_FOUND": UnknownNameError,
    "UNAUTHENTICATED": DeniedError,
    "PERMISSION_DENIED": DeniedError,
    "UNIMPLEMENTED": UnsupportedError,
}


#: What a user who cannot reach the coordinator does next: the end of the unreachable
#: line for a user's command (``hetero-coord``, ``hetero-top``), not for an agent, which
#: retries on its own.
COORDINATOR_HINT = (
    "is one running? start one with 'hetero-coord serve' (docs/deploy.md), "
    "or name another with --coordinator HOST:PORT"
)


def error_for_status(
    status: str | None, details: str, target: str, *, hint: str = ""
) -> RemoteError:
    """The ``HeteroError`` for a call that failed with gRPC status ``status`` (the
    ``grpc.StatusCode`` member's name; None if the call ended without one) and the
    server's ``details``. ``target`` says what was called, for the unreachable message
    (e.g. "the coordinator at 10.0.0.1:7070"), and ``hint`` what to do about it (e.g.
    :data:`COORDINATOR_HINT`; unreachable only). The message is always one line."""
    reason = " ".join(details.split())
    cls = STATUS_ERRORS.get(status, RemoteError) if status is not None else UnreachableError
    if cls is UnreachableError:
        then = f"; {hint}" if hint else ""
        return UnreachableError(
            f"cannot reach {target} ({reason or status or 'no answer'}){then}", status
        )
    return cls(reason or f"{target} refused the request ({status})", status)
