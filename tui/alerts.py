"""Alert rules: what in a job's newest interval an operator should act on.

Pure functions over the state model. Each rule names the bottleneck and the
evidence; thresholds live in ``AlertRules`` so a test (or a future config
file) can move them.

- *straggler*: the coordinator's flag (per-sample compute time well above the
  other ranks' for several intervals), passed through;
- *input-bound*: a rank spends a large share of its step waiting for data;
- *communication-bound*: even the slowest rank, which never waits for peers,
  spends a large share of its step in the all-reduce. Faster ranks wait in
  the all-reduce for the slowest one too, so their wait measures imbalance,
  not the network: only the smallest wait over ranks is the network's;
- *memory-bound*: a rank's peak memory is near its device's memory, so the
  balancer cannot give it a larger batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.core.errors import ConfigError
from hetero.tui.state import ClusterState, JobView


@dataclass(frozen=True)
class Alert:
    kind: str  # "straggler", "input-bound", "communication-bound", "memory-bound"
    message: str
    #: The rank concerned; None for the whole job.
    rank: int | None = None


@dataclass(frozen=True)
class AlertRules:
    """Fractions of a rank's wall step time, or of its device memory, in [0, 1]."""

    input_bound_fraction: float = 0.25
    comm_bound_fraction: float = 0.30
    memory_bound_fraction: float = 0.90

    def __post_init__(self) -> None:
        for name in ("input_bound_fraction", "comm_bound_fraction", "memory_bound_fraction"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{name} must be in (0, 1], got {value}")


def job_alerts(
    job: JobView, cluster: ClusterState, rules: AlertRules | None = None
) -> tuple[Alert, ...]:
    """Every alert for ``job`` from its newest interval, stragglers first."""
    rules = rules or AlertRules()
    live = job.live
    if live is None or job.finished:
        return ()
    out = [Alert("straggler", s.message, s.rank) for s in live.stragglers]
    ran = [r for r in live.ranks if r.steps > 0 and r.step_s > 0]
    for r in ran:
        if r.data_s is not None and r.data_s / r.step_s >= rules.input_bound_fraction:
            out.append(
                Alert(
                    "input-bound",
                    f"input-bound: rank {r.rank} waits for data {r.data_s / r.step_s:.0%} of "
                    "each step (more loader workers, faster storage?)",
                    r.rank,
                )
            )
    waits = [(r.comm_wait_s / r.step_s, r.rank) for r in ran if r.comm_wait_s is not None]
    if waits and len(waits) == len(ran) > 1:
        least, _ = min(waits)
        if least >= rules.comm_bound_fraction:
            out.append(
                Alert(
                    "communication-bound",
                    f"communication-bound: the all-reduce takes at least {least:.0%} of every "
                    "rank's step (larger global batch, gradient compression, faster network?)",
                )
            )
    placement = {r.rank: (r.node_id, r.device_index) for r in job.ranks}
    for r in ran:
        where = placement.get(r.rank)
        device = cluster.device(*where) if where is not None else None
        total = device.profile_memory_bytes or device.memory_total_bytes if device else None
        if r.peak_memory_bytes is None or not total:
            continue
        frac = r.peak_memory_bytes / total
        if frac >= rules.memory_bound_fraction:
            out.append(
                Alert(
                    "memory-bound",
                    f"memory-bound: rank {r.rank} peaks at {frac:.0%} of its device's memory; "
                    "its batch cannot grow",
                    r.rank,
                )
            )
    return tuple(out)
