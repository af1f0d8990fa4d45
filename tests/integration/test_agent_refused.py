"""An agent whose token the coordinator refuses says so once, in one line that names the
token it sent, where that came from and how to give the right one, and keeps retrying
(issue #34: it retried UNAUTHENTICATED with nothing a person could act on, and looked
hung). The real agent against a real coordinator that requires a token, on port 0."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from hetero.agent.config import AgentConfig
from hetero.agent.daemon import Agent
from hetero.agent.profile import NodeProfile
from hetero.coordinator.server import Settings, create_server
from hetero.security.auth import Secret
from hetero.security.transport import ServerSecurity, client_security

TOKEN = "tok-7f3a9c1be5d24f6a8b0c1d2e3f405162"


def test_a_refused_agent_says_once_which_token_it_sent_and_how_to_fix_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    server, port = create_server("127.0.0.1:0", settings, ServerSecurity(token=Secret(TOKEN)))
    server.start()
    wrong = tmp_path / "old.token"
    wrong.write_text("x" * 40 + "\n")
    wrong.chmod(0o600)
    config = AgentConfig(
        coordinator=f"127.0.0.1:{port}",
        name="node-c",
        address="127.0.0.1",
        local_listen="127.0.0.1:0",
        state_dir=tmp_path / "agent",
    )
    security = client_security(wrong, address=config.coordinator)
    agent = Agent(config, NodeProfile("test cpu", 2, 10.0, 1 << 30, ()), security=security)
    thread = threading.Thread(target=agent.run, daemon=True)
    caplog.set_level(logging.INFO, logger="hetero.agent")
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while agent.link.backoff.failures < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        agent.stop()
        thread.join(timeout=15)
        server.stop(0).wait()
    assert agent.link.backoff.failures >= 3, "it kept retrying"
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "hetero.agent" and r.levelno >= logging.WARNING
    ]
    assert warned == [
        f"coordinator {config.coordinator} refused this agent's token, from token file "
        f"{wrong}: give it the coordinator's token (a copy of the coordinator's token file, "
        "mode 0600) or node node-c's own credential (hetero-coord node-token node-c --out "
        "FILE), as --token-file FILE or token_file: in agent.yaml; retrying, at most every 30 s"
    ]
