"""Attack: probe the coordinator's gRPC health service (issue 17, item 8).

Before the fix the auth guard broke the standard health service: ``Check`` of an
unknown service answered INTERNAL with a TypeError traceback in the log (2,000
probes wrote 1 MB of tracebacks past the rate-limited rejection log), and
``Watch`` always failed. Real coordinator on port 0, with and without a token.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hetero.coordinator.server import SERVICE_NAME, Settings, create_server
from hetero.security.auth import new_token
from hetero.security.transport import ServerSecurity

DEADLINE_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


@pytest.fixture(params=["no token", "token"])
def health(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[health_pb2_grpc.HealthStub]:
    deps = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    security = ServerSecurity(token=new_token() if request.param == "token" else None)
    server, port = create_server("127.0.0.1:0", deps, security)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")  # probes carry no credentials
    try:
        yield health_pb2_grpc.HealthStub(channel)
    finally:
        channel.close()
        server.stop(0).wait()


def test_check_answers_serving_for_known_services_without_credentials(health) -> None:  # type: ignore[no-untyped-def]
    for service in ("", SERVICE_NAME):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S)
        assert resp.status == SERVING, service


def test_check_of_an_unknown_service_is_not_found_and_logs_no_traceback(
    health, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.ERROR, logger="hetero.security.guard")
    for _ in range(20):
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Svc"), timeout=DEADLINE_S)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "Traceback" not in (err.value.details() or "")
    assert [r for r in caplog.records if r.name == "hetero.security.guard"] == []


def test_watch_streams_the_status_of_known_and_unknown_services(health) -> None:  # type: ignore[no-untyped-def]
    for service, expected in (("", SERVING), (SERVICE_NAME, SERVING), ("nope", SERVICE_UNKNOWN)):
        stream = health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S)
        try:
            assert next(stream).status == expected, service
        finally:
            stream.cancel()
