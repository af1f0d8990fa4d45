"""What the gradient all-reduce costs a job of another size: the exclusion forecast's
communication model.

The exposed all-reduce time is measured (``estimate_comm_s``) for the job as it
runs, with W ranks on one backend. A forecast for the job without a rank needs it
for W−1 ranks:

- **One rank has no all-reduce.** DDP with a world of one communicates nothing,
  whatever the backend: the time is 0. (Charging the measured all-reduce to a
  one-rank job made a GPU + CPU job look faster *with* its CPU rank.)
- **Same backend, W' ≥ 2 ranks:** the ring algorithms Gloo and NCCL use for large
  gradients move ``2(W−1)/W`` of the gradient through each rank, so the
  bandwidth-bound time scales by ``((W'−1)/W') / ((W−1)/W)``: ×0.75 from 3 ranks
  to 2, ×0.5 from 2 ranks to... one, which the first rule covers. The latency
  term (``2(W−1)`` small messages) is ignored: a gradient of megabytes is
  bandwidth-bound.
- **Another backend** (dropping the last CPU rank moves a job from Gloo to
  NCCL): a Gloo measurement says nothing of NCCL's speed over NVLink or PCIe,
  which is higher; the scaled Gloo time is kept as an *upper bound*, so the
  forecast understates the gain of exclusion, never overstates it.

Before a job has measured its own, the node-to-node links its agents measured
(``agent.peerprobe``) predict it: :func:`link_comm_s`, a value for
``Constraints.comm_s`` of an initial plan and its predictions. Measured history
replaces it at the first re-plan (``core.replan.next_plan``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Bytes of one gradient element: DDP reduces fp32 gradients of fp32 parameters, also
#: under autocast (the parameters stay fp32).
GRADIENT_ELEMENT_BYTES = 4


def ring_fraction(world: int) -> float:
    """Gradient bytes each rank sends (and receives) in a ring all-reduce, per byte of
    gradient: ``2(W−1)/W``; 0 for one rank."""
    return 2.0 * (world - 1) / world if world > 1 else 0.0


def backend_for(kinds: Sequence[str]) -> str:
    """The backend a job on devices of these kinds uses (placement's rule)."""
    return "nccl" if kinds and all(k == "cuda" for k in kinds) else "gloo"


def all_reduce_s(measured_s: float, measured_world: int, world: int) -> float:
    """The exposed all-reduce seconds per step for ``world`` ranks, from ``measured_s``
    measured with ``measured_world`` ranks on the same backend (an upper bound when the
    smaller job would use a faster one). 0 for one rank."""
    if world <= 1:
        return 0.0
    if measured_world <= 1:
        return measured_s  # nothing was measured to scale from (a one-rank job has none)
    return measured_s * ring_fraction(world) / ring_fraction(measured_world)


def ring_all_reduce_s(gradient_bytes: float, world: int, bytes_per_s: float, rtt_s: float) -> float:
    """Seconds of one ring all-reduce of ``gradient_bytes`` over ``world`` ranks whose
    slowest link carries ``bytes_per_s`` with round trip ``rtt_s``: ``2(W−1)/W`` of the
    gradient through that link plus ``2(W−1)`` one-way hops (half a round trip each).
    0 for one rank. A prediction from the node-to-node probe (``agent.peerprobe``)
    for ``Constraints.comm_s`` before a job has measured its own (``estimate_comm_s``);
    an upper bound where DDP overlaps the all-reduce with the backward pass."""
    if world <= 1:
        return 0.0
    if not (bytes_per_s > 0 and rtt_s >= 0):
        raise ValueError(f"a link needs bytes_per_s > 0 and rtt_s >= 0, got {bytes_per_s}, {rtt_s}")
    return ring_fraction(world) * gradient_bytes / bytes_per_s + (world - 1) * rtt_s


@dataclass(frozen=True)
class Link:
    """A measured node-to-node link: the slower direction's bytes per second and the
    round trip in seconds (``agent.peerprobe``)."""

    bytes_per_s: float
    rtt_s: float


def link_comm_s(parameters: int, world: int, links: Iterable[Link]) -> float:
    """The all-reduce seconds per step a job of ``parameters`` fp32 parameters on
    ``world`` ranks should expect before it has measured its own: a ring over the
    measured links between its nodes is bounded by the slowest (least bandwidth, and
    the longest round trip), :func:`ring_all_reduce_s`. 0 where no link was measured
    (every rank on one node, whose shared memory or NVLink the probe does not time):
    the prediction stays compute-only, as before."""
    known = [x for x in links if x.bytes_per_s > 0]
    if not known or world <= 1:
        return 0.0
    slowest = min(x.bytes_per_s for x in known)
    longest = max(x.rtt_s for x in known)
    return ring_all_reduce_s(parameters * GRADIENT_ELEMENT_BYTES, world, slowest, longest)
