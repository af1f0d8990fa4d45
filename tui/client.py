"""hetero-top's gRPC client: every call with a deadline, every failure a ``HeteroError``.

Blocking on purpose: the app calls it from thread workers, never from the UI
thread. ``watch`` opens a fresh channel per stream, so after a coordinator
restart the next attempt connects at once instead of waiting out the old
channel's reconnect backoff (up to two minutes in gRPC's defaults).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from hetero.core.errors import COORDINATOR_HINT, DeniedError, RemoteError, UnreachableError
from hetero.security.transport import ClientSecurity, client_channel, remote_error
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

T = TypeVar("T")

#: Seconds a unary request may take.
REQUEST_TIMEOUT_S = 5.0
#: A watch stream is re-opened after this long (its deadline), without a banner.
STREAM_DEADLINE_S = 300.0


class CoordinatorClient:
    """Requests to one coordinator. Thread-safe: each call may come from another worker."""

    def __init__(
        self,
        address: str,
        timeout_s: float = REQUEST_TIMEOUT_S,
        security: ClientSecurity | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.security = security
        self._channel = client_channel(address, security)
        self._stub = pb_grpc.CoordinatorStub(self._channel)  # type: ignore[no-untyped-call, unused-ignore]
        self._lock = threading.Lock()
        self._stream: Any = None  # the open WatchCluster call, cancelled by close()
        self._closed = False

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> RemoteError:
        return remote_error(exc, f"the coordinator at {self.address}", hint=COORDINATOR_HINT)

    def check_access(self, timeout_s: float = 5.0) -> None:
        """Raise ``DeniedError`` if the coordinator refuses these credentials; anything
        else (not up yet, slow) is left to the view, which shows it and retries."""
        try:
            self._stub.ListNodes(pb.ListNodesRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            error = self._error(exc)
            if isinstance(error, DeniedError):
                raise error from None

    def job_detail(self, job_id: str, max_intervals: int = 120) -> pb.JobDetail:
        request = pb.GetJobDetailRequest(job_id=job_id, max_intervals=max_intervals)
        result: pb.JobDetail = self._call(
            lambda: self._stub.GetJobDetail(request, timeout=self.timeout_s)
        )
        return result

    def cancel_job(self, job_id: str) -> pb.Job:
        request = pb.CancelJobRequest(job_id=job_id)
        result: pb.Job = self._call(lambda: self._stub.CancelJob(request, timeout=self.timeout_s))
        return result

    def drain_node(self, node: str, undrain: bool = False) -> pb.Node:
        request = pb.DrainNodeRequest(node=node, undrain=undrain)
        result: pb.Node = self._call(lambda: self._stub.DrainNode(request, timeout=self.timeout_s))
        return result

    def watch(self, period_s: float) -> Iterator[pb.ClusterSnapshot]:
        """Snapshots until the stream ends. Raises ``UnreachableError`` if the coordinator
        cannot be reached or goes away; returns quietly at the stream's own deadline."""
        channel = client_channel(self.address, self.security)
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
        try:
            call = stub.WatchCluster(
                pb.WatchClusterRequest(period_s=period_s), timeout=STREAM_DEADLINE_S
            )
            with self._lock:
                if self._closed:
                    return
                self._stream = call
            try:
                yield from call
            except grpc.RpcError as exc:
                error = self._error(exc)
                if error.status == "DEADLINE_EXCEEDED":
                    return  # the stream's own deadline: the caller re-opens it
                if error.status == "CANCELLED" and self._closed:
                    return
                raise error from None
            # A stream the server ended (it is shutting down) is a disconnect too.
            raise UnreachableError(f"the coordinator at {self.address} closed the stream")
        finally:
            with self._lock:
                self._stream = None
            channel.close()

    def close(self) -> None:
        """Cancel an open watch stream and close the channel; later calls fail."""
        with self._lock:
            self._closed = True
            stream = self._stream
        if stream is not None:
            stream.cancel()
        self._channel.close()
