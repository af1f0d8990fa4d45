"""What an input pipeline's workers add per sample: jitter, and an EMULATED decode cost.

Both are specs a scenario and the zoo loops' flags share (pure: standard library
only, so ``hetero-bench run --dry-run`` validates them without torch), applied in
DataLoader workers by ``workloads.Delayed``, identically in hetero's loop and
the plain-DDP loop:

- **jitter** (``--loader-jitter``): a sleep per sample, lognormal with mean
  ``mean_ms`` and log-space spread ``sigma``, plus a stall of ``stall_ms`` with
  probability ``stall_p``. It stands for the variance of real pipelines (a
  network file system, a disk, images of varying size) and sleeps: waiting
  holds a worker but no core. Each sample's delay is a fixed function of
  ``(seed, index)``, as a large file is always large, so both loops and every
  epoch see the same per-sample costs;
- **input cost** (``--input-cost-ms``, EMULATED): a busy-wait of that many
  milliseconds per sample in the workers of every rank or of the ranks named,
  standing for decode work that burns a core (CPU tests of an input-bound rank).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from hetero.core.errors import ConfigError

_JITTER_KEYS = ("mean_ms", "sigma", "stall_p", "stall_ms")
#: z of the 99th percentile of a standard normal (for the description of a lognormal).
_Z99 = 2.3263


@dataclass(frozen=True)
class Jitter:
    """A per-sample delay: lognormal (mean ``mean_ms`` ms, log-space ``sigma``) plus a
    ``stall_ms`` stall with probability ``stall_p``. The spec is
    ``mean_ms=M[,sigma=S][,stall_p=P,stall_ms=T]`` (a bare number is ``mean_ms``)."""

    mean_ms: float
    sigma: float = 1.0
    stall_p: float = 0.0
    stall_ms: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.mean_ms < math.inf:
            raise ConfigError(f"loader jitter: mean_ms must be > 0, got {self.mean_ms:g}")
        if not 0.0 <= self.sigma <= 4.0:
            raise ConfigError(f"loader jitter: sigma must be in [0, 4], got {self.sigma:g}")
        if not 0.0 <= self.stall_p < 1.0:
            raise ConfigError(f"loader jitter: stall_p must be in [0, 1), got {self.stall_p:g}")
        if self.stall_ms < 0 or (self.stall_p > 0) != (self.stall_ms > 0):
            raise ConfigError("loader jitter: give stall_p and stall_ms together, both > 0")

    def delay_s(self, seed: int, index: int) -> float:
        """Sample ``index``'s delay in seconds (the same for the same seed and index)."""
        rng = random.Random(seed * 1_000_003 + index)
        mu = math.log(self.mean_ms) - self.sigma**2 / 2.0  # so the mean is mean_ms
        ms = rng.lognormvariate(mu, self.sigma) if self.sigma > 0 else self.mean_ms
        if self.stall_p > 0 and rng.random() < self.stall_p:
            ms += self.stall_ms
        return ms / 1e3

    def describe(self) -> str:
        p99 = math.exp(math.log(self.mean_ms) - self.sigma**2 / 2.0 + _Z99 * self.sigma)
        stalls = f", stalls of {self.stall_ms:g} ms with p {self.stall_p:g}" if self.stall_p else ""
        return (
            f"loader jitter: lognormal sleep per sample, mean {self.mean_ms:g} ms, sigma "
            f"{self.sigma:g} (p99 {p99:.1f} ms){stalls}"
        )


def parse_jitter(spec: str | None) -> Jitter | None:
    """``--loader-jitter``'s spec (class doc); None for none; ``ConfigError`` naming the part."""
    if not spec:
        return None
    values: dict[str, float] = {}
    for k, part in enumerate(p.strip() for p in spec.split(",")):
        key, sep, text = part.partition("=")
        if not sep and k == 0:
            key, text = "mean_ms", part
        if key not in _JITTER_KEYS:
            raise ConfigError(
                f"loader jitter: cannot parse {part!r}; expected "
                "mean_ms=M[,sigma=S][,stall_p=P,stall_ms=T]"
            )
        try:
            values[key] = float(text)
        except ValueError:
            raise ConfigError(f"loader jitter: {key} must be a number, got {text!r}") from None
    if "mean_ms" not in values:
        raise ConfigError(f"loader jitter: {spec!r} gives no mean_ms")
    return Jitter(**values)


@dataclass(frozen=True)
class InputCost:
    """EMULATED decode work: ``ms`` of busy-wait per sample on the ranks of ``ranks``
    (empty: every rank). The spec is ``MS`` (every rank) or ``RANK:MS,...``."""

    per_rank: tuple[tuple[int, float], ...] = ()
    every_rank_ms: float = 0.0

    def ms_for(self, rank: int) -> float:
        return dict(self.per_rank).get(rank, self.every_rank_ms)

    def describe(self) -> str:
        where = (
            ", ".join(f"rank {r} {ms:g} ms" for r, ms in self.per_rank)
            if self.per_rank
            else f"every rank {self.every_rank_ms:g} ms"
        )
        return f"EMULATED input cost: busy-wait per sample in the loader workers, {where}"


def parse_input_cost(spec: str | None) -> InputCost | None:
    """``--input-cost-ms``'s spec (class doc); None for none; ``ConfigError`` naming it."""
    if not spec:
        return None
    try:
        if ":" not in spec:
            cost = InputCost(every_rank_ms=float(spec))
        else:
            pairs = [part.split(":") for part in spec.split(",")]
            per_rank = tuple(sorted((int(r), float(ms)) for r, ms in pairs))
            if len({r for r, _ in per_rank}) < len(per_rank):
                raise ConfigError(f"input cost: a rank is given twice in {spec!r}")
            cost = InputCost(per_rank=per_rank)
    except ValueError:
        raise ConfigError(
            f"input cost: cannot parse {spec!r}; expected MS or RANK:MS,..."
        ) from None
    ms = [cost.every_rank_ms, *(m for _, m in cost.per_rank)]
    if any(not 0.0 <= m < 10_000 for m in ms) or any(r < 0 for r, _ in cost.per_rank):
        raise ConfigError(f"input cost: ranks >= 0 and 0 <= MS < 10000, got {spec!r}")
    return cost


def busy_wait(seconds: float) -> None:
    """Spin for ``seconds`` on this core (decode work's cost, unlike a sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
