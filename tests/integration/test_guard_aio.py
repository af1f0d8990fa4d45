"""The guard of a ``grpc.aio`` server (``hetero.security.guard.AioGuardInterceptor``) with a
handler that aborts after its client has gone: under load a coordinator's call
that waited past its deadline aborts DEADLINE_EXCEEDED when the client has
already left, gRPC fails to send that status, and the guard took the failure for
the handler's own error: it logged "internal error" with a traceback and aborted
a second time ("Abort already called!", a second traceback from gRPC)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from hetero.security.transport import ServerSecurity, new_aio_server

METHOD = "/hetero.test.Slow/Call"


class _Server:
    """A real ``grpc.aio`` server with hetero's interceptors, on a loop of its own thread,
    whose one method blocks its loop past the client's deadline, then aborts."""

    def __init__(self) -> None:
        self.handled = threading.Event()
        #: Set by the test once its call has failed on its deadline: the client has gone.
        self.client_gone = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server, self.port = self._run(self._build())
        self._run(self.server.start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _build(self) -> tuple[grpc.aio.Server, int]:
        server = new_aio_server(ServerSecurity(), what="test", hint="none")

        async def call(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            try:
                # The loop is busy (as under load) until the client's deadline has passed
                # and it has gone: gRPC cannot tell this handler so.
                self.client_gone.wait(30)
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "too late")
            finally:
                self.handled.set()
            return b""

        handler = grpc.method_handlers_generic_handler(
            "hetero.test.Slow", {"Call": grpc.unary_unary_rpc_method_handler(call)}
        )
        server.add_generic_rpc_handlers((handler,))
        return server, server.add_insecure_port("127.0.0.1:0")

    def stop(self) -> None:
        self._run(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture
def slow() -> Iterator[_Server]:
    server = _Server()
    try:
        yield server
    finally:
        server.stop()


def test_an_abort_after_the_client_left_is_not_an_internal_error_nor_a_second_abort(
    slow: _Server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        with grpc.insecure_channel(f"127.0.0.1:{slow.port}") as channel:
            # Connected first: the call's deadline is spent reaching the handler, not on
            # the connection a loaded host is slow to make.
            grpc.channel_ready_future(channel).result(timeout=30)
            call = channel.unary_unary(METHOD)
            with pytest.raises(grpc.RpcError) as info:
                call(b"", timeout=1.0)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        slow.client_gone.set()
        assert slow.handled.wait(30)
        # gRPC's handling of the failed status ends on the server's loop after the
        # handler: a call made on that loop runs after it.
        slow._run(asyncio.sleep(0.2))
    assert "internal error" not in caplog.text
    assert "Abort already called" not in caplog.text
    assert "Traceback" not in caplog.text
