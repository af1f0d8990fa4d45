"""The ``/metrics`` scrapers of ``hetero-bench load --scrapers N``, and the phases they run in.

The measured window is cut into phases of ``scrape_phase_s``; the scrapers are
quiet in the even ones and busy in the odd ones, so one run gives the heartbeat
latency with and without them on the same coordinator, database and machine
state (halves of a run would also compare the start with the end).

In a busy phase half the ``N`` clients scrape back to back (connect, ``GET
/metrics``, read the whole answer, close) and half hold half-open connections
(connect, send part of a request and nothing more, until the server drops the
connection; then again): the attack of issue 17, 200 half-open connections,
beside an honest scraper's load. Each is a plain socket (``asyncio`` streams):
an HTTP library would finish its requests.

A busy phase ends its clients' work: a connection still being made (the server
stops accepting while full, so a client can wait in the listening socket's
backlog and in TCP's retries for many seconds), a scrape still being read, a
half-open connection still held, are closed at the phase's end and counted as
``cut``. Before, they ran on into the quiet phase after it, and its heartbeats
paid for a busy phase's scrapes: on the 2-core box, p99 of one quiet second after
another at 30 to 90 ms where runs without scrapers had 8 to 15 ms.

The process runs at ``nice`` 19 unless told otherwise (``--scrapers-nice``): the
clients stand in for Prometheus and attackers on other hosts, whose CPU is not the
coordinator's; on a 2-core box at an equal share they took a core of the two and
slowed the heartbeats through the generators' and the coordinator's run queue, not
through anything the coordinator did. Where Linux groups each session's processes
for CPU time (autogroup, ``/proc/sys/kernel/sched_autogroup_enabled``), a process's
niceness only orders it within its session's group, and the groups share the CPU
equally: the coordinator, in a session of its own, got one core of two whenever the
scrapers' session was busy, whatever their niceness. So the scrapers run in a
session of their own and give its group the same niceness.

Run by the orchestrator as ``python -m hetero.bench.loadscrape CONFIG.json``; waits for
``go.json`` beside the generators' folders and writes ``result.json``: scrapes
answered and their latencies, connections the server refused or dropped, and
half-open connections made.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Seconds a half-open connection is held at most (the server should drop it sooner).
HOLD_S = 30.0
#: Seconds a full scrape may take before it counts as failed.
SCRAPE_TIMEOUT_S = 10.0
#: Pause between one scraper's scrapes, seconds: back to back, but not a busy loop on
#: a refused connection.
PAUSE_S = 0.05


def busy(t_unix_s: float, start_unix_s: float, phase_s: float) -> bool:
    """Whether the scrapers run at ``t_unix_s``: in the odd phases of the window."""
    return t_unix_s >= start_unix_s and int((t_unix_s - start_unix_s) // phase_s) % 2 == 1


def phase_end(t_unix_s: float, start_unix_s: float, phase_s: float) -> float:
    """When the phase holding ``t_unix_s`` (at or after the window's start) ends."""
    return start_unix_s + (int((t_unix_s - start_unix_s) // phase_s) + 1) * phase_s


@dataclass(frozen=True)
class ScrapeConfig:
    host: str
    port: int
    scrapers: int
    phase_s: float
    #: CPU niceness of this process (``LoadConfig.scrapers_nice``).
    nice: int = 19


@dataclass
class ScrapeResult:
    scrapes: int = 0
    scrape_latencies_s: list[float] = field(default_factory=list)
    half_open: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    #: Connections and scrapes closed unfinished at the end of their busy phase.
    cut: int = 0


class Scrapers:
    def __init__(self, config: ScrapeConfig, start: float, end: float) -> None:
        self.config = config
        self.start, self.end = start, end
        self.result = ScrapeResult()

    async def _until_busy(self) -> bool:
        """Wait for a busy phase; False once the window has ended."""
        c = self.config
        while time.time() < self.end:
            if busy(time.time(), self.start, c.phase_s):
                return True
            await asyncio.sleep(0.05)
        return False

    async def _in_phase(self, work: Callable[[], Awaitable[None]]) -> None:
        """``work`` until the end of the busy phase it starts in, when it is cancelled
        (its connection closed with it) and counted as cut."""
        left = phase_end(time.time(), self.start, self.config.phase_s) - time.time()
        try:
            await asyncio.wait_for(work(), max(left, 0.0))
        except TimeoutError:
            self.result.cut += 1

    async def scraper(self) -> None:
        while await self._until_busy():
            await self._in_phase(self._scrape)
            await asyncio.sleep(PAUSE_S)

    async def _scrape(self) -> None:
        c = self.config
        t0 = time.perf_counter()
        writer = None
        try:
            reader, writer = await asyncio.open_connection(c.host, c.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: load\r\nConnection: close\r\n\r\n")
            body = await asyncio.wait_for(reader.read(), SCRAPE_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self.result.failures[f"scrape:{type(exc).__name__}"] += 1
            return
        finally:
            if writer is not None:
                writer.close()
        if body.startswith(b"HTTP/1.0 200") or body.startswith(b"HTTP/1.1 200"):
            self.result.scrapes += 1
            self.result.scrape_latencies_s.append(time.perf_counter() - t0)
        else:
            self.result.failures["scrape:not-200"] += 1

    async def half_open(self) -> None:
        while await self._until_busy():
            await self._in_phase(self._hold)
            await asyncio.sleep(PAUSE_S)

    async def _hold(self) -> None:
        c = self.config
        writer = None
        try:
            reader, writer = await asyncio.open_connection(c.host, c.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: lo")  # and never the rest
            self.result.half_open += 1
            await asyncio.wait_for(reader.read(), HOLD_S)  # returns when the server drops it
        except (OSError, TimeoutError) as exc:
            self.result.failures[f"half-open:{type(exc).__name__}"] += 1
        finally:
            if writer is not None:
                writer.close()

    async def run(self) -> None:
        n = self.config.scrapers
        tasks = [self.scraper() if i % 2 == 0 else self.half_open() for i in range(n)]
        await asyncio.gather(*tasks)


#: Tries at setting the autogroup's niceness: the kernel lets an unprivileged process
#: change one group's at most every 100 ms, machine-wide (EAGAIN otherwise).
AUTOGROUP_TRIES = 20


def lower_priority(nice: int) -> None:
    """``nice`` for this process and, where the kernel groups sessions, for its session's
    group (this process leads a session of its own: ``loadrun``). No autogroup: the
    process's niceness alone."""
    os.nice(nice)
    group = Path("/proc/self/autogroup")
    for _ in range(AUTOGROUP_TRIES):
        try:
            group.write_text(str(nice))
            return
        except BlockingIOError:
            time.sleep(0.1)
        except OSError:  # no autogroup in this kernel, or not allowed
            return


def main(argv: list[str]) -> int:
    config_path = Path(argv[0])
    config = ScrapeConfig(**json.loads(config_path.read_text()))
    lower_priority(config.nice)
    go_path = config_path.parent.parent / "go.json"
    while not go_path.exists():
        time.sleep(0.05)
    go = json.loads(go_path.read_text())
    scrapers = Scrapers(config, go["start_unix_s"], go["end_unix_s"])
    asyncio.run(scrapers.run())
    result = asdict(scrapers.result)
    result["failures"] = dict(scrapers.result.failures)
    tmp = config_path.parent / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.rename(config_path.parent / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
