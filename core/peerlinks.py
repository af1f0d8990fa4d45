"""Which node-to-node links to measure when a job is placed across nodes: pure, for the
coordinator (``coordinator.peerlinks``), which keeps the results with the nodes' host
profiles and predicts a job's all-reduce from them (``core.balancer.link_comm_s``).

- **When.** Placing a job whose ranks span two or more nodes asks for the links
  between those nodes, and nothing else does: a job's all-reduce crosses its own
  nodes' links, and N nodes have N(N−1)/2 pairs, most of which no job spans.
- **Fresh.** A link measured less than :data:`FRESH_S` ago (an hour, by the
  coordinator's clock, when it received the figures) is not measured again: a LAN
  does not change by the minute, and a probe moves 16 MiB. An hour still catches a
  node moved to another switch or a link renegotiated to a lower rate the same day.
- **Asked once.** A pair asked for is not asked again for :data:`FRESH_S`,
  answered or not: a peer that cannot be reached (a firewall closing the probe's
  port, an agent started with ``--no-peer-probe`` since) costs one try and one
  line an hour, never one per job placed, and never a retry loop.
- **One probe per pair.** A probe times both directions (``agent.peerprobe``), and
  the coordinator keeps its figures with both nodes, the other's seen from its
  side: the node whose name sorts first measures, so two nodes never probe each
  other at once (each would halve the other's figures), and which node measures
  does not depend on the order of a job's ranks.
- **Serving nodes only.** A pair takes part only if both agents serve a probe: a
  node whose agent does not (``--no-peer-probe``, or an older agent) has no links.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

#: Seconds a measured link stays fresh, and a pair asked for is not asked again.
FRESH_S = 3600.0
#: Bytes of the random token a probe connection must open with (``agent.peerprobe``):
#: 128 bits: not guessed, however long a probe server answers.
TOKEN_BYTES = 16

#: A link's two nodes, by name, in either order.
Pair = frozenset[str]


def to_measure(
    nodes: Iterable[str],
    serving: Collection[str],
    measured_at: Mapping[Pair, float],
    asked_at: Mapping[Pair, float],
    now: float,
    *,
    fresh_s: float = FRESH_S,
) -> list[tuple[str, str]]:
    """``(measurer, target)`` node names for each pair of ``nodes`` (a job's, any order,
    repeats allowed) that both serve a probe and has no link measured, nor was asked
    for, within ``fresh_s`` of ``now`` (Unix s). ``measured_at``: when the coordinator
    received each pair's newest link (0: a registration's, of unknown age);
    ``asked_at``: when it last asked for each. The measurer sorts first."""
    names = sorted({n for n in nodes if n in serving})
    due = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pair = frozenset((a, b))
            times = (measured_at.get(pair, 0.0), asked_at.get(pair, 0.0))
            if not any(t > 0 and now - t < fresh_s for t in times):  # 0: none, or age unknown
                due.append((a, b))
    return due
