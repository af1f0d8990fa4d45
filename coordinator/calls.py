"""How a Coordinator call is handled (``api``): its request checked against the bounds
of every field (``bounds``) and against its caller (``scope``), refused while this
coordinator is a standby, its errors turned into status codes (a
``HeteroError`` with its ``grpc_code`` and message; anything else is INTERNAL, by
``security.guard``), and its time counted into ``/metrics``' histogram
(``metrics``)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from hetero.coordinator import bounds
from hetero.coordinator.identity import Caller
from hetero.coordinator.writer import StoreUnavailable
from hetero.core.errors import ConfigError, HeteroError
from hetero.core.states import JobState, RankState

#: What a standby coordinator answers every call (``standby``).
STANDBY = "standby: this coordinator waits to take over from the one serving its database"

Handler = Callable[[Any, Any, Caller], Awaitable[Any]]


class PermissionDenied(HeteroError):
    grpc_code = "PERMISSION_DENIED"


def rpc(
    method: Handler,
) -> Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    """A handler checked against its caller, its errors as status codes, its time counted."""
    name = method.__name__

    @functools.wraps(method)
    async def call(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        code = "OK"
        failed: HeteroError | None = None
        try:
            if not self.service.ready:
                raise StoreUnavailable(STANDBY)
            bounds.check(name, request)
            caller = self.identities.of(context.invocation_metadata(), context.auth_context())
            if caller.scoped:
                refused = self.scope.check(self.service.state, caller, name, request)
                if refused is not None:
                    raise PermissionDenied(refused)
            return await method(self, request, caller)
        except HeteroError as exc:
            failed, code = exc, exc.grpc_code
        except asyncio.CancelledError:  # the client went away, or its deadline passed
            left = context.time_remaining()
            code = "DEADLINE_EXCEEDED" if left is not None and left <= 0 else "CANCELLED"
            raise
        except Exception:  # the guard interceptor answers it INTERNAL, logged
            code = "INTERNAL"
            raise
        finally:
            self.latency.observe(name, code, time.perf_counter() - started)
        assert failed is not None
        status = getattr(grpc.StatusCode, failed.grpc_code, grpc.StatusCode.FAILED_PRECONDITION)
        await context.abort(status, str(failed))

    return call


def invalid(message: str) -> ConfigError:
    """A request whose content is wrong: INVALID_ARGUMENT with ``message``."""
    return ConfigError(message)


def state_name(states: type[JobState] | type[RankState], value: int, field: str) -> str:
    try:
        return states(value).name
    except ValueError:
        raise invalid(f"{field}: unknown value {value}") from None


async def stream_bounds(
    context: grpc.aio.ServicerContext[Any, Any], method: str, request: Any
) -> None:
    """A stream's request against ``bounds`` (``rpc`` checks the others' requests)."""
    try:
        bounds.check(method, request)
    except ConfigError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
