"""Node-to-node links as the coordinator keeps them: asked for when a job is placed
across nodes, reported by the agents that measured them, kept with both nodes' host
profiles, and handed to the planner. Which pairs to ask for is ``core.peerlinks``'.

- **The probe's endpoint.** An agent that serves a link probe (``agent.peerprobe``)
  says where, its port and a token of 16 random bytes, when it opens its order stream
  (``WatchOrdersRequest``). The coordinator keeps them on the node in memory while
  that stream is open: never in its database, its log, ``/metrics`` or what
  ``ListNodes`` returns; it hands them only to an agent it orders to measure a link
  to that node, on that agent's own authenticated stream. They travel with the
  stream, not with ``RegisterNode``: an agent registers once, but opens its stream
  again after every coordinator restart, so a restarted coordinator learns every
  endpoint again without a secret ever stored.
- **Asking.** Placing a job, or a restart of one, on two or more nodes asks, for each
  pair due, the node that sorts first to measure the other: a ``PeerProbeOrder`` on
  its order stream, sent once, naming the other node's registered address and its
  endpoint as it is when the order goes out (none then: the order is dropped). An
  order lost with a stream is asked for again after ``FRESH_S``, like a failed one.
- **Reports** (``ReportPeerLinks``). Each link must name a node the reporter was
  asked to measure within ``FRESH_S``: another name is refused, INVALID_ARGUMENT in
  one line, before anything changes (the figures were bounded by ``bounds``). Each
  is stamped with the coordinator's clock and kept with the reporter's host profile,
  in place of its older link to that peer, and with the peer's as seen from there
  (send and receive swapped); both nodes are written.
- **Registering again** (a new score, a restarted agent) keeps a node's links: its
  network did not change. The links a registration carries replace those to the
  same peers, with no time (their age is unknown).
- **Planning.** :func:`between` gives the links among a placement's nodes as
  ``core.balancer.Link``; a pair never measured is no constraint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from hetero.coordinator import persist
from hetero.coordinator.placement import Placement
from hetero.coordinator.state import ClusterState, Node
from hetero.core.balancer import Link
from hetero.core.errors import ConfigError
from hetero.core.peerlinks import FRESH_S, TOKEN_BYTES, Pair, to_measure
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

if TYPE_CHECKING:
    from hetero.coordinator.cluster import Cluster

log = logging.getLogger("hetero.coordinator")


def endpoint(req: pb.WatchOrdersRequest) -> tuple[int, bytes] | None:
    """The probe endpoint an order stream's request announces; None: it serves none.
    ``ConfigError`` (never quoting the token) for a token of the wrong length."""
    if not req.peer_probe_port:
        return None
    if len(req.peer_probe_token) != TOKEN_BYTES:
        raise ConfigError(
            f"WatchOrders: peer_probe_token must be {TOKEN_BYTES} bytes with a "
            f"peer_probe_port, got {len(req.peer_probe_token)}"
        )
    return req.peer_probe_port, req.peer_probe_token


def ask(
    state: ClusterState, asked: dict[Pair, float], node_ids: Iterable[str], *, now: float
) -> set[str]:
    """Order the links among ``node_ids`` (a placement's) that are due measured
    (module doc); ``asked`` is when each pair was last asked for, and is updated.
    Returns the nodes whose orders changed."""
    nodes = {n.name: n for n in (state.nodes[i] for i in set(node_ids))}
    if len(nodes) < 2:
        return set()
    serving = [name for name, n in nodes.items() if n.peer_probe is not None]
    due = to_measure(nodes, serving, _measured_at(nodes.values()), asked, now)
    for a, b in due:
        asked[frozenset((a, b))] = now
        nodes[a].probe_targets.append(nodes[b].id)
    if due:
        pairs = ", ".join(f"{a}->{b}" for a, b in due)
        log.info("measuring links %s (a job spans them; none fresh)", pairs)
    return {nodes[a].id for a, _ in due}


def take_orders(state: ClusterState, node_id: str) -> list[pb.PeerProbeOrder]:
    """The node's probe orders not yet sent, to send now (they are forgotten here)."""
    node = state.nodes.get(node_id)
    if node is None or not node.probe_targets:
        return []
    out = []
    for target in (state.nodes.get(i) for i in node.probe_targets):
        if target is not None and target.peer_probe is not None:
            port, token = target.peer_probe
            out.append(
                pb.PeerProbeOrder(peer=target.name, address=target.address, port=port, token=token)
            )
    node.probe_targets.clear()
    return out


def report(c: Cluster, node_id: str, links: Sequence[tpb.PeerLink], *, now: float) -> None:
    """Keep the ``links`` node ``node_id`` measured with its profile and its peers'
    (module doc), and write them. ``ConfigError`` for a link to a node it was not asked
    to measure, before anything changes."""
    state, asked, node = c.state, c.link_asks, c.node(node_id)
    peers = []
    for i, link in enumerate(links):
        at = asked.get(frozenset((node.name, link.peer)))
        peer = state.node_named(link.peer)
        if peer is None or peer is node or at is None or not now - at < FRESH_S:
            raise ConfigError(
                f"ReportPeerLinks: links[{i}].peer: node {node.name} was not asked to "
                f"measure a link to {link.peer!r}"
            )
        peers.append(peer)
    for link, peer in zip(links, peers, strict=True):
        mine = _copied(link)
        mine.measured_at_unix_s = now
        theirs = tpb.PeerLink(peer=node.name, rtt_s=link.rtt_s, measured_at_unix_s=now)
        if link.HasField("send_bytes_per_s"):
            theirs.receive_bytes_per_s = link.send_bytes_per_s
        if link.HasField("receive_bytes_per_s"):
            theirs.send_bytes_per_s = link.receive_bytes_per_s
        node.host_profile = _with_links(node.host_profile, [mine])
        peer.host_profile = _with_links(peer.host_profile, [theirs])
    for changed in {n.id: n for n in [node, *peers]}.values() if links else ():
        c.add(persist.save_node(changed))


def registered(old: object | None, new: object | None) -> tpb.HostProfile | None:
    """The host profile to keep for a node registering ``new``: its links to peers
    ``new`` does not name kept from ``old`` (module doc)."""
    kept = list(old.peer_links) if isinstance(old, tpb.HostProfile) else []
    if not isinstance(new, tpb.HostProfile):
        return None if not kept else tpb.HostProfile(peer_links=kept)
    fresh = tpb.HostProfile()
    fresh.CopyFrom(new)
    for link in fresh.peer_links:
        link.ClearField("measured_at_unix_s")  # a registration's links are of unknown age
    return _with_links(fresh, kept, replace=False)


def between(state: ClusterState, placement: Placement) -> list[Link]:
    """The measured links among ``placement``'s nodes, either end's."""
    node_ids = {r.device.node_id for r in placement.ranks}
    nodes = [state.nodes[i] for i in node_ids if i in state.nodes]
    names = {n.name for n in nodes}
    out = []
    for n in nodes:
        profile = n.host_profile
        for link in profile.peer_links if isinstance(profile, tpb.HostProfile) else ():
            rates = [r for r in (link.send_bytes_per_s, link.receive_bytes_per_s) if r > 0]
            if link.peer in names and link.peer != n.name and rates:
                out.append(Link(min(rates), link.rtt_s))
    return out


def _measured_at(nodes: Iterable[Node]) -> dict[Pair, float]:
    """When the coordinator received each pair's newest link (0: age unknown)."""
    out: dict[Pair, float] = {}
    for n in nodes:
        profile = n.host_profile
        for link in profile.peer_links if isinstance(profile, tpb.HostProfile) else ():
            pair = frozenset((n.name, link.peer))
            out[pair] = max(out.get(pair, 0.0), link.measured_at_unix_s)
    return out


def _with_links(
    profile: object | None, links: Sequence[tpb.PeerLink], *, replace: bool = True
) -> tpb.HostProfile:
    """A copy of ``profile`` (none: an empty one) with ``links``: each in place of the
    profile's link to the same peer (``replace``), or only where it has none."""
    out = tpb.HostProfile()
    if isinstance(profile, tpb.HostProfile):
        out.CopyFrom(profile)
    by_peer = {link.peer: _copied(link) for link in out.peer_links}
    for link in links:
        if replace or link.peer not in by_peer:
            by_peer[link.peer] = _copied(link)
    del out.peer_links[:]
    out.peer_links.extend(by_peer[p] for p in sorted(by_peer))
    return out


def _copied(link: tpb.PeerLink) -> tpb.PeerLink:
    out = tpb.PeerLink()
    out.CopyFrom(link)
    return out
