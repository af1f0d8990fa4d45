"""The coordinator's background loop survives a failing round and runs its last call."""

from __future__ import annotations

import threading

from hetero.coordinator.periodic import Periodic


def test_a_failing_round_is_logged_the_loop_goes_on_and_last_runs_once(caplog) -> None:  # type: ignore[no-untyped-def]
    rounds: list[int] = []
    third = threading.Event()
    last: list[str] = []

    def tick() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("boom")
        if len(rounds) == 3:
            third.set()

    loop = Periodic("test-loop", 0.01, tick, failure="round failed", last=lambda: last.append("x"))
    loop.start()
    assert third.wait(5.0)
    loop.stop(timeout_s=None)
    assert "round failed" in caplog.text
    assert len(rounds) >= 3 and last == ["x"]
    loop.stop()  # stopping twice does nothing
