"""``hetero-bench load``'s scrapers (``bench/loadscrape``) keep to their busy phases: a
connection still open when its phase ends is closed then and counted as cut, so the
quiet phase after it measures the coordinator without scrapers."""

from __future__ import annotations

import asyncio
import time

from hetero.bench.loadscrape import ScrapeConfig, Scrapers, busy

PHASE_S = 0.6
#: How long into a quiet phase a connection of the busy one may take to close: the
#: scrapers and this server share one event loop, which a loaded host can stall for
#: 100 ms; a connection the scrapers left open lingers through the whole phase.
CLOSING_S = PHASE_S / 2


def test_connections_of_a_busy_phase_are_closed_when_it_ends() -> None:
    open_at: list[tuple[float, int]] = []  # (time, connections open) at each change
    live: set[asyncio.StreamWriter] = set()

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        live.add(writer)
        open_at.append((time.time(), len(live)))
        try:
            await reader.read()  # until the client closes
        finally:
            live.discard(writer)
            open_at.append((time.time(), len(live)))
            writer.close()

    async def main() -> tuple[Scrapers, float]:
        server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        start = time.time() + 0.2
        scrapers = Scrapers(
            ScrapeConfig("127.0.0.1", port, 6, PHASE_S, 0), start, start + 4 * PHASE_S
        )
        await scrapers.run()
        await asyncio.sleep(0.2)
        server.close()
        return scrapers, start

    scrapers, start = asyncio.run(main())
    assert scrapers.result.half_open > 0 and scrapers.result.cut > 0
    # Nothing the scrapers opened is open in a quiet phase, past a moment to close it.
    late = [
        (round(t - start, 2), n)
        for t, n in open_at
        if n > 0 and not busy(t - CLOSING_S, start, PHASE_S) and not busy(t, start, PHASE_S)
    ]
    assert not late, f"connections open in a quiet phase: {late}"
