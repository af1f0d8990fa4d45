"""The agent's part in measuring node-to-node links (``agent.peerprobe``) for the
coordinator, which asks for them when a job spans nodes (``coordinator.peerlinks``).

- **Serving.** While the agent runs it answers link probes on
  ``0.0.0.0:peer_probe_port`` (0, the default: a port the kernel picks), with a
  token of 16 random bytes made at each start. The port and the token go to the
  coordinator alone, over the agent's authenticated channel, when the order stream
  opens (``WatchOrdersRequest``); the log names the port, never the token. The
  other nodes must reach the port (a firewall note: docs/deploy.md).
- **Off.** ``--no-peer-probe`` (``peer_probe: false``) serves nothing and announces
  no port: the coordinator then has no links for this node, and jobs across it
  are planned without them, as before the links were measured. The agent says so
  at start.
- **Measuring.** ``Orders.measure_links`` go to a thread of their own, which probes
  each peer in turn and reports what it measured in one ``ReportPeerLinks`` call
  per order: never on the agent's loop, whose rank launches and heartbeats must not
  wait seconds for a probe (16 MiB each way at most, 10 s timeouts). A peer that
  cannot be reached, or a report the coordinator refuses, is one warning line and
  no retry: the coordinator asks again after an hour if a job still spans the pair.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Sequence

import grpc

from hetero.agent.config import AgentConfig
from hetero.agent.link import CALL_TIMEOUT_S, CoordinatorLink
from hetero.agent.peerprobe import PeerLink, PeerProbeServer, measure_peer
from hetero.agent.profile import peer_link_message
from hetero.core.errors import ConfigError
from hetero.core.peerlinks import TOKEN_BYTES
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.agent")


class PeerLinks:
    """The node's probe server (none when ``config.peer_probe`` is off) and the thread
    that measures the links the coordinator orders. ``measured``: links measured
    since start (each probe that answered)."""

    def __init__(self, config: AgentConfig, link: CoordinatorLink) -> None:
        self._link = link
        self._token = os.urandom(TOKEN_BYTES)
        self._server: PeerProbeServer | None = None
        if config.peer_probe:
            try:
                self._server = PeerProbeServer(self._token, "0.0.0.0", config.peer_probe_port)
            except OSError as exc:  # a fixed port another process holds
                raise ConfigError(
                    f"peer_probe_port {config.peer_probe_port}: cannot listen ({exc.strerror}); "
                    "give another, 0 for any, or --no-peer-probe"
                ) from None
        self._orders: queue.Queue[Sequence[pb.PeerProbeOrder] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="peer-links", daemon=True)
        self.measured = 0

    @property
    def endpoint(self) -> tuple[int, bytes] | None:
        """(port, token) to announce to the coordinator; None: probes are off."""
        return None if self._server is None else (self._server.port, self._token)

    def start(self) -> None:
        if self._server is None:
            log.info(
                "link probe off (--no-peer-probe, peer_probe: false): the coordinator "
                "measures no links to this node, and plans jobs across it without them"
            )
        else:
            log.info("answering link probes on port %d", self._server.port)
        self._thread.start()

    def measure(self, orders: Sequence[pb.PeerProbeOrder]) -> None:
        """Measure these links in the background, then report them."""
        if orders:
            self._orders.put(list(orders))

    def close(self) -> None:
        self._orders.put(None)
        self._thread.join(timeout=1.0)  # a probe under way ends with the process
        if self._server is not None:
            self._server.close()

    def _run(self) -> None:
        while (orders := self._orders.get()) is not None:
            links = [link for o in orders if (link := self._probe(o)) is not None]
            if links:
                self._report(links)

    def _probe(self, order: pb.PeerProbeOrder) -> PeerLink | None:
        where = f"{order.peer} ({order.address}:{order.port})"
        try:
            link = measure_peer(order.peer, order.address, order.port, order.token)
        except OSError as exc:
            log.warning("link to %s not measured: %s; not retried", where, exc)
            return None
        self.measured += 1
        rate = link.bytes_per_s
        log.info(
            "link to %s: rtt %.3f ms, %s",
            where,
            link.rtt_s * 1e3,
            f"{rate / 1e6:,.0f} MB/s" if rate else "too fast to time",
        )
        return link

    def _report(self, links: Sequence[PeerLink]) -> None:
        node_id = self._link.node_id
        if node_id is None:
            log.warning("%d measured link(s) not reported: not registered", len(links))
            return
        request = pb.ReportPeerLinksRequest(
            node_id=node_id, links=[peer_link_message(x) for x in links]
        )
        try:
            self._link.stub.ReportPeerLinks(request, timeout=CALL_TIMEOUT_S)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel closed
            detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
            log.warning("%d measured link(s) not reported: %s; not retried", len(links), detail)
