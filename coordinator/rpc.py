"""How a Coordinator RPC handler runs: its errors become status codes, and the
reads every group of handlers shares.

Errors leave as status codes: a ``HeteroError`` aborts with its ``grpc_code``
and message; anything else is logged with its traceback and aborts INTERNAL,
so a client never sees UNKNOWN.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import views
from hetero.coordinator.deps import Deps
from hetero.coordinator.identity import ANYONE
from hetero.coordinator.models import JobRow
from hetero.core.errors import ConfigError, HeteroError
from hetero.core.states import JobState, RankState
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.ServicerContext], Resp]


def abort_for(context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
    """Abort the call with ``exc``'s status (a ``HeteroError``'s own code, else INTERNAL
    naming the method and the exception type, logged with its traceback)."""
    if isinstance(exc, HeteroError):
        code = getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.FAILED_PRECONDITION)
        context.abort(code, str(exc))
    log.exception("internal error in %s", method)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}")


def rpc(method: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Map exceptions of a unary handler to status codes."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Req, context: grpc.ServicerContext) -> Resp:
        try:
            return method(self, request, context)
        except Exception as exc:
            abort_for(context, exc, method.__name__)
            raise  # unreachable: abort raises

    return wrapper


def caller_of(context: object) -> str:
    """Who made the call (``identity``): the name ``asyncserver`` put on its context;
    "anyone" on a context without one."""
    caller = getattr(context, "caller", None)
    return caller if isinstance(caller, str) else ANYONE


def time_left(context: object) -> float | None:
    """Seconds until the call's deadline (None: no deadline, or a context that cannot say)."""
    remaining = getattr(context, "time_remaining", None)
    left = remaining() if callable(remaining) else None
    return float(left) if isinstance(left, int | float) else None


def invalid(message: str) -> ConfigError:
    """A request whose content is wrong: INVALID_ARGUMENT with ``message``."""
    return ConfigError(message)


def state_name(states: type[JobState] | type[RankState], value: int, field: str) -> str:
    """``2`` -> ``RUNNING``; a number the enum lacks is INVALID_ARGUMENT."""
    try:
        return states(value).name
    except ValueError:
        raise invalid(f"{field}: unknown value {value}") from None


class Handlers:
    """What every group of handlers (nodes, jobs, plans) shares: ``deps`` and its reads."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._read: sessionmaker[Session] = deps.readers or deps.sessions

    def _job(self, s: Session, job: JobRow, detail: bool = False) -> pb.Job:
        return views.job_message(s, job, detail)

    def _live(self) -> views.Live | None:
        return self.deps.ingest.current if self.deps.ingest is not None else None

    def _nodes(self, s: Session) -> list[pb.Node]:
        return views.nodes(
            s, now=self.deps.clock(), timeout_s=self.deps.heartbeat_timeout_s, live=self._live()
        )

    def snapshot(self) -> pb.ClusterSnapshot:
        """The cluster now: what WatchCluster streams and the metrics endpoint exports
        (``deps.snapshots``' shared one where there is one)."""
        if self.deps.snapshots is not None:
            return self.deps.snapshots.message()
        with self._read() as s:
            return views.cluster_snapshot(
                s,
                now=self.deps.clock(),
                timeout_s=self.deps.heartbeat_timeout_s,
                live=self._live(),
            )
