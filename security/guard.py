"""A server interceptor that makes every failure of a hetero RPC a deliberate status code.

Without it, gRPC answers a request whose bytes do not decode with INTERNAL
("Exception deserializing request!") and an exception a handler did not
translate with UNKNOWN, both with no hint for the caller. Here the request is
decoded inside the handler, so undecodable bytes are INVALID_ARGUMENT naming
the method, and an unexpected exception is logged with its traceback and
answered INTERNAL naming the method and the exception type: a client never
sees UNKNOWN and never a Python traceback. A handler that aborted itself keeps
its own status.

Oversized messages never reach a handler: the server's
``grpc.max_receive_message_length`` (:data:`hetero.security.transport.MAX_MESSAGE_BYTES`)
makes gRPC answer RESOURCE_EXHAUSTED. ``AioGuardInterceptor`` does the same for a
``grpc.aio`` server (the coordinator's).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import grpc.aio

log = logging.getLogger("hetero.security.guard")


#: Longest status message, in characters: gRPC sends it in a header (8 KiB by default),
#: and a message that echoes a hostile request must stay a readable line.
MAX_DETAILS_CHARS = 1000


def one_line(details: str) -> str:
    """``details`` on one line, at most :data:`MAX_DETAILS_CHARS` characters."""
    text = " ".join(str(details).splitlines())
    return text if len(text) <= MAX_DETAILS_CHARS else text[: MAX_DETAILS_CHARS - 3] + "..."


class _Context:
    """The handler's context, with every status message made :func:`one_line`."""

    def __init__(self, inner: grpc.ServicerContext) -> None:
        self._inner = inner

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._inner.abort(code, one_line(details))

    def set_details(self, details: str) -> None:
        self._inner.set_details(one_line(details))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _decode(
    deserializer: Callable[[bytes], Any] | None,
    raw: bytes,
    context: grpc.ServicerContext,
    method: str,
) -> Any:
    if deserializer is None:
        return raw
    try:
        return deserializer(raw)
    except Exception:
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{method}: the request is not a valid message for this method",
        )


def _internal(exc: Exception, context: grpc.ServicerContext, method: str) -> None:
    """Re-raise an abort the handler made itself; turn anything else into INTERNAL."""
    if context.code() is not None:  # type: ignore[func-returns-value, unused-ignore]
        raise exc
    log.error("internal error in %s", method, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}")


class GuardInterceptor(grpc.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """Decode inside the handler and translate stray exceptions (unary requests only;
    hetero has no client-streaming RPC, and such handlers pass through unchanged)."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        method = details.method.rsplit("/", 1)[-1] or details.method
        deserializer = handler.request_deserializer
        serializer = handler.response_serializer

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(raw: bytes, context: grpc.ServicerContext) -> Any:
                request = _decode(deserializer, raw, context, method)
                try:
                    return inner(request, _Context(context))
                except Exception as exc:
                    _internal(exc, context, method)

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serializer)

        if handler.unary_stream is not None:
            stream = handler.unary_stream

            def streaming(raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
                request = _decode(deserializer, raw, context, method)
                try:
                    yield from stream(request, _Context(context))
                except Exception as exc:
                    _internal(exc, context, method)

            return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=serializer)
        return handler


class _AsyncContext:
    """:class:`_Context` for ``grpc.aio``: ``abort`` is a coroutine there."""

    def __init__(self, inner: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._inner = inner
        #: The handler called ``abort``: what it raises next is gRPC's, not the handler's.
        self.aborted = False

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.aborted = True
        # The standard health servicer aborts with a code alone (NOT_FOUND).
        await self._inner.abort(code, one_line(details))

    def set_details(self, details: str) -> None:
        self._inner.set_details(one_line(details))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _decode_async(
    deserializer: Callable[[bytes], Any] | None,
    raw: bytes,
    context: grpc.aio.ServicerContext[Any, Any],
    method: str,
) -> Any:
    if deserializer is None:
        return raw
    try:
        return deserializer(raw)
    except Exception:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{method}: the request is not a valid message for this method",
        )


async def _internal_async(exc: Exception, context: _AsyncContext, method: str) -> None:
    """Re-raise an abort; turn anything else into INTERNAL.

    After the handler's own ``abort`` whatever comes out is gRPC's: its ``AbortError``,
    or the failure to send the status to a client that has gone (its deadline passed
    while the call waited: ``ExecuteBatchError``, which gRPC drops for a closed call).
    It goes back to gRPC unchanged: a second ``abort`` only raised "Abort already
    called!", and both were logged with tracebacks as internal errors."""
    if isinstance(exc, grpc.aio.AbortError) or context.aborted:
        raise exc
    log.error("internal error in %s", method, exc_info=exc)
    await context.abort(
        grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}"
    )


class AioGuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """:class:`GuardInterceptor` for a ``grpc.aio`` server, whose handlers are
    coroutines and async generators."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        method = details.method.rsplit("/", 1)[-1] or details.method
        deserializer = handler.request_deserializer
        serializer = handler.response_serializer

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                request = await _decode_async(deserializer, raw, context, method)
                guarded = _AsyncContext(context)
                try:
                    return await inner(request, guarded)
                except Exception as exc:
                    await _internal_async(exc, guarded, method)

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serializer)

        if handler.unary_stream is not None and inspect.iscoroutinefunction(handler.unary_stream):
            # A streaming handler may be a coroutine that sends with ``context.write``
            # instead of an async generator (the standard health servicer's ``Watch``).
            writer = handler.unary_stream

            async def writing(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
                request = await _decode_async(deserializer, raw, context, method)
                guarded = _AsyncContext(context)
                try:
                    await writer(request, guarded)
                except Exception as exc:
                    await _internal_async(exc, guarded, method)

            return grpc.unary_stream_rpc_method_handler(writing, response_serializer=serializer)

        if handler.unary_stream is not None:
            stream = handler.unary_stream

            async def streaming(
                raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                request = await _decode_async(deserializer, raw, context, method)
                guarded = _AsyncContext(context)
                try:
                    async for item in stream(request, guarded):
                        yield item
                except Exception as exc:
                    await _internal_async(exc, guarded, method)

            return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=serializer)
        return handler
