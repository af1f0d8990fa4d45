"""The client side of bearer-token authentication (``hetero.security.auth``): a channel that
sends ``authorization: Bearer <token>`` on every call."""

from __future__ import annotations

import collections
from typing import Any

import grpc

from hetero.security.auth import METADATA_KEY, SCHEME, Secret


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,  # type: ignore[misc, unused-ignore]
):
    pass


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc, unused-ignore]
):
    """Adds the bearer token to every call's metadata (plain or TLS channels alike:
    gRPC's call credentials refuse plaintext channels, and loopback is plaintext)."""

    def __init__(self, token: Secret) -> None:
        self._token = token

    def _with_token(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [m for m in (d.metadata or ()) if m[0] != METADATA_KEY]
        metadata.append((METADATA_KEY, f"{SCHEME} {self._token.reveal()}"))
        return _CallDetails(
            d.method,
            d.timeout,
            metadata,
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


def with_token(channel: grpc.Channel, token: Secret | None) -> grpc.Channel:
    """``channel`` sending ``token`` on every call (``channel`` itself if no token)."""
    if token is None:
        return channel
    return grpc.intercept_channel(channel, _BearerToken(token))
