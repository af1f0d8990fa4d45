"""What a run of ``hetero-bench load`` is asked to do (``LoadConfig``, from the command's
flags, validated at once) and the error of a run that could not be set up or did not
complete."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetero.core.catalogue.limits import MAX_RANKS
from hetero.core.errors import ConfigError, HeteroError


class LoadError(HeteroError):
    """The load run could not be set up or did not complete."""

    exit_code = 1


@dataclass(frozen=True)
class LoadConfig:
    agents: int = 1000
    ranks: int = 256
    world_size: int = 8
    processes: int = 4
    duration_s: float = 120.0
    warmup_s: float = 10.0
    #: Seconds between one agent's heartbeats; None = the interval the coordinator gives
    #: each agent at registration, as hetero-agent heartbeats (2 s by default). The
    #: figures of this benchmark before 2026-11-28 were taken at 1 s.
    heartbeat_s: float | None = None
    interval_s: float = 1.0
    devices_per_agent: int = 4
    #: Seconds between the orchestrator's submissions of a small job (each cancelling
    #: the one before) during the window: orders for the agents' streams to carry, whose
    #: pushes are timed (0 = none).
    churn_s: float = 1.0
    #: Every rank calls ``GetPlan`` after its job's report, as this benchmark's load did
    #: before 2026-11-28. The trainer does not: rank 0 alone reports (through its agent)
    #: and gives the ranks the plan by a broadcast of its own, so by default only the
    #: reports reach the coordinator. Kept to compare with the figures of that load.
    get_plan_per_rank: bool = False
    seed: int = 0
    #: The coordinator's database: an empty PostgreSQL database's URL; None = a new
    #: SQLite file in the run directory.
    db: str | None = None
    #: Jobs waiting QUEUED behind the running ones for the whole run (``loadqueue``).
    queued: int = 0
    #: Concurrent ``/metrics`` clients, half scraping, half half-open, in every other
    #: phase of ``scrape_phase_s`` (``loadscrape``); 0 = no metrics listener.
    scrapers: int = 0
    scrape_phase_s: float = 10.0
    #: CPU niceness of the scrapers' process: they stand in for clients on other hosts,
    #: so on a shared box they take the CPU the coordinator and the generators leave.
    scrapers_nice: int = 19
    #: CPUs the coordinator and its worker processes run on; the generators and the
    #: scrapers then run on the others (empty = no pinning: all share every CPU). On a
    #: host with cores to spare this stands in for a coordinator of N cores with its
    #: clients on other hosts.
    coordinator_cpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.agents < 1 or self.processes < 1 or self.world_size < 1:
            raise ConfigError("--agents, --processes and --world-size must be >= 1")
        if self.ranks < 0 or self.ranks % self.world_size:
            raise ConfigError(f"--ranks ({self.ranks}) must be a multiple of --world-size")
        if self.ranks > self.agents * self.devices_per_agent:
            raise ConfigError(f"--ranks ({self.ranks}) exceeds the agents' devices")
        heartbeat = 1.0 if self.heartbeat_s is None else self.heartbeat_s
        periods = (self.duration_s, self.interval_s, heartbeat)
        if min(periods) <= 0 or self.warmup_s < 0:
            raise ConfigError("durations and periods must be > 0 (--warmup-s >= 0)")
        if not 1 <= self.devices_per_agent <= 64:
            raise ConfigError("--devices-per-agent must be in [1, 64]")
        if self.queued < 0 or self.scrapers < 0 or self.scrape_phase_s <= 0:
            raise ConfigError("--queued and --scrapers must be >= 0, --scrape-phase-s > 0")
        if self.queued and self.agents * self.devices_per_agent >= MAX_RANKS:
            raise ConfigError(
                f"--queued: a queued job asks for one rank more than every device, at most "
                f"{MAX_RANKS:,} ranks; {self.agents} agents have "
                f"{self.agents * self.devices_per_agent:,} devices"
            )
        if not 0 <= self.scrapers_nice <= 19:
            raise ConfigError(f"--scrapers-nice must be in [0, 19], got {self.scrapers_nice}")
        if self.scrapers and self.duration_s < 2 * self.scrape_phase_s:
            raise ConfigError("--scrapers needs --duration of at least 2 scrape phases")
        if self.coordinator_cpus:
            usable = available_cpus()
            if not set(self.coordinator_cpus) <= usable:
                outside = sorted(set(self.coordinator_cpus) - usable)
                raise ConfigError(
                    f"--coordinator-cpus: CPU {outside[0]} is not one this process may use "
                    f"({format_cpus(usable)})"
                )
            if not usable - set(self.coordinator_cpus):
                raise ConfigError(
                    "--coordinator-cpus leaves no CPU for the load generators "
                    f"({format_cpus(usable)} usable)"
                )
        if self.churn_s < 0:
            raise ConfigError(f"--churn-s must be >= 0 seconds, got {self.churn_s:g}")

    @property
    def jobs(self) -> int:
        return self.ranks // self.world_size


def available_cpus() -> set[int]:
    """The CPUs this process may run on."""
    return set(os.sched_getaffinity(0))


def parse_cpus(text: str) -> tuple[int, ...]:
    """``0,1`` or ``0-3,8`` as sorted CPU numbers; a one-line ``ConfigError`` otherwise."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            lo, hi = int(first), int(last if dash else first)
        except ValueError:
            raise ConfigError(
                f"--coordinator-cpus: {part.strip()!r} is not a CPU number or range like 0-1"
            ) from None
        if lo < 0 or hi < lo:
            raise ConfigError(f"--coordinator-cpus: bad range {part.strip()!r}")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpus(cpus: set[int] | tuple[int, ...]) -> str:
    """CPU numbers as ranges: ``0-1,4``."""
    ranges: list[str] = []
    for cpu in sorted(cpus):
        if ranges and cpu == int(ranges[-1].split("-")[-1]) + 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges)
