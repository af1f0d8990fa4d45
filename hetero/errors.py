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


class DistributedError(HeteroError):
    """A process-group failure: a dead peer, a timed-out collective."""

    grpc_code = "UNAVAILABLE"


class RemoteError(HeteroError):
    """A request the coordinator refused; the message is its one-line reason."""

    grpc_code = "FAILED_PRECONDITION"


class UnreachableError(RemoteError):
    """The coordinator did not answer in time, or is down: retry later."""

    grpc_code = "UNAVAILABLE"
    exit_code = 3
