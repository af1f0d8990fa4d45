"""The agent's link to the coordinator: its retry delays, exponential, capped and jittered
so that agents refused or cut off together do not call again in the same instant, and
what it tells a person whose agent has no token (issue #34)."""

from __future__ import annotations

import random

from hetero.agent.link import Backoff


def test_retries_wait_a_random_part_of_the_capped_exponential_delay() -> None:
    backoff = Backoff(initial_s=0.5, max_s=30.0, rng=random.Random(7))
    waits = [backoff.failed() for _ in range(12)]
    nominal = [min(30.0, 0.5 * 2**k) for k in range(12)]
    assert all(n / 2 <= w <= n for w, n in zip(waits, nominal, strict=True))
    assert (
        waits != nominal and len({round(w / n, 6) for w, n in zip(waits, nominal, strict=True)}) > 1
    )
    assert backoff.delay_s == 30.0
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.failed() <= 0.5


def test_an_agent_without_a_token_is_told_where_it_looked() -> None:
    from hetero.agent.link import refused_token_hint
    from hetero.security.auth import local_token_path
    from hetero.security.transport import ClientSecurity

    remote = refused_token_hint("10.0.0.1:7070", "gpu-3", ClientSecurity())
    assert remote.startswith(
        "coordinator 10.0.0.1:7070 requires a token and this agent has none (no --token-file, "
        "$HETERO_TOKEN_FILE or $HETERO_TOKEN): give it the coordinator's token"
    )
    assert "hetero-coord node-token gpu-3 --out FILE" in remote
    local = refused_token_hint("127.0.0.1:7070", "gpu-3", ClientSecurity())
    assert f"$HETERO_TOKEN, nor a readable {local_token_path()}): " in local
