"""Client-side error translation: one rule turns a gRPC status into a ``HeteroError``."""

from __future__ import annotations

import grpc
import pytest

from hetero.core.errors import (
    COORDINATOR_HINT,
    STATUS_ERRORS,
    ConfigError,
    DeniedError,
    HeteroError,
    InvalidRequestError,
    RemoteError,
    UnknownNameError,
    UnreachableError,
    UnsupportedError,
    error_for_status,
)
from hetero.security.transport import is_unreachable, remote_error

TARGET = "the coordinator at 10.0.0.1:7070"


@pytest.mark.parametrize(
    ("status", "cls", "exit_code"),
    [
        (None, UnreachableError, 3),
        ("UNAVAILABLE", UnreachableError, 3),
        ("DEADLINE_EXCEEDED", UnreachableError, 3),
        ("INVALID_ARGUMENT", InvalidRequestError, 2),
        ("OUT_OF_RANGE", InvalidRequestError, 2),
        ("NOT_FOUND", UnknownNameError, 1),
        ("UNAUTHENTICATED", DeniedError, 1),
        ("PERMISSION_DENIED", DeniedError, 1),
        ("UNIMPLEMENTED", UnsupportedError, 1),
        ("FAILED_PRECONDITION", RemoteError, 1),
        ("RESOURCE_EXHAUSTED", RemoteError, 1),
        ("INTERNAL", RemoteError, 1),
    ],
)
def test_each_status_becomes_its_error_with_its_exit_code(
    status: str | None, cls: type[RemoteError], exit_code: int
) -> None:
    error = error_for_status(status, "job j-1: no such job", TARGET)
    assert type(error) is cls and error.exit_code == exit_code
    if cls is UnreachableError:
        assert str(error) == f"cannot reach {TARGET} (job j-1: no such job)"
    else:
        assert str(error) == "job j-1: no such job" and error.status == status


def test_messages_are_one_line_even_when_the_details_are_not() -> None:
    error = error_for_status("INTERNAL", "first line\n  second line\n", TARGET)
    assert str(error) == "first line second line"
    assert "\n" not in str(error_for_status("UNAVAILABLE", "a\nb", TARGET))
    assert str(error_for_status("ABORTED", "", TARGET)) == f"{TARGET} refused the request (ABORTED)"


def test_a_servers_error_arrives_at_its_client_as_the_same_kind() -> None:
    # The server sends a HeteroError's grpc_code; the client maps that code back.
    for cls in set(STATUS_ERRORS.values()):
        assert type(error_for_status(cls.grpc_code, "x", TARGET)) is cls
    # A bad value found by the server reads, and exits, as one found locally.
    assert error_for_status(ConfigError.grpc_code, "x", TARGET).exit_code == ConfigError.exit_code
    assert all(issubclass(c, HeteroError) for c in STATUS_ERRORS.values())


def test_a_real_call_to_nothing_is_unreachable() -> None:
    with grpc.insecure_channel("127.0.0.1:1") as channel:
        call = channel.unary_unary("/hetero.v1.Coordinator/ListNodes")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", timeout=2.0)
    assert is_unreachable(caught.value)
    error = remote_error(caught.value, "the coordinator at 127.0.0.1:1")
    assert isinstance(error, UnreachableError)
    assert str(error).startswith("cannot reach the coordinator at 127.0.0.1:1 (")


def test_a_user_who_cannot_reach_the_coordinator_is_told_how_to_start_one() -> None:
    with grpc.insecure_channel("127.0.0.1:1") as channel:
        call = channel.unary_unary("/hetero.v1.Coordinator/ListNodes")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", timeout=2.0)
    error = str(remote_error(caught.value, "the coordinator at 127.0.0.1:1", hint=COORDINATOR_HINT))
    assert error.startswith("cannot reach the coordinator at 127.0.0.1:1 (")
    assert error.endswith("; " + COORDINATOR_HINT) and "\n" not in error
    assert "'hetero-coord serve'" in COORDINATOR_HINT
    # A refusal is the server's own reason: no hint about starting a coordinator.
    assert str(error_for_status("NOT_FOUND", "x", TARGET, hint=COORDINATOR_HINT)) == "x"


def test_hetero_top_that_cannot_reach_the_coordinator_says_how_to_start_one() -> None:
    from hetero.tui.client import CoordinatorClient

    client = CoordinatorClient("127.0.0.1:1", timeout_s=2.0)
    try:
        with pytest.raises(UnreachableError) as caught:
            client.job_detail("j-1")
    finally:
        client.close()
    assert str(caught.value).endswith(COORDINATOR_HINT)
