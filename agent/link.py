"""The agent's link to the coordinator: register, heartbeat, poll orders, back off.

The coordinator being down at start or later is never fatal: calls are retried
with exponential backoff (capped at half the heartbeat timeout, so a restarted
coordinator hears from every agent before it would call one down), and telemetry
sampled meanwhile waits in the outbox (``agent.outbox``). A coordinator that
no longer knows the node (its database was reset) gets a fresh registration.
The agent polls for orders only after a heartbeat whose reply says some may be
pending (``orders_pending``), not after every heartbeat.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import grpc

from hetero import __version__
from hetero.agent.config import AgentConfig, outbound_address
from hetero.agent.network import CHANNEL_OPTIONS, measure_network
from hetero.agent.outbox import Outbox
from hetero.agent.profile import NodeProfile
from hetero.agent.telemetry import TelemetrySampler
from hetero.core.errors import UnknownNameError, UnreachableError, UnsupportedError
from hetero.security.transport import ClientSecurity, client_channel, is_unreachable, remote_error
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("hetero.agent")

#: Seconds each coordinator call may take.
CALL_TIMEOUT_S = 5.0
#: Pages of orders one contact follows at most (the rest come at the next contact).
MAX_ORDER_PAGES = 64


def orders_pending(reply: pb.HeartbeatResponse) -> bool:
    """Whether to poll after this heartbeat: when the coordinator says so, and always
    for one that predates the flag (it leaves it unset)."""
    return not reply.HasField("orders_pending") or reply.orders_pending


@dataclass
class Backoff:
    """Exponential retry delay in seconds: ``initial_s`` doubling up to ``max_s``."""

    initial_s: float = 0.5
    max_s: float = 30.0
    delay_s: float = 0.0
    failures: int = 0

    def failed(self) -> float:
        self.failures += 1
        self.delay_s = min(self.max_s, self.initial_s * 2 ** (self.failures - 1))
        return self.delay_s

    def succeeded(self) -> None:
        self.failures, self.delay_s = 0, 0.0


class CoordinatorLink:
    """One node's conversation with the coordinator. ``node_id`` is None until the
    coordinator accepted a registration (and again once it forgot the node)."""

    def __init__(
        self,
        config: AgentConfig,
        profile: NodeProfile,
        security: ClientSecurity,
        telemetry: TelemetrySampler,
        outbox: Outbox,
    ) -> None:
        self.config = config
        #: The node as last registered, with its measured network once it was.
        self.profile = profile
        self.telemetry = telemetry
        self.outbox = outbox
        self.channel = client_channel(config.coordinator, security, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.CoordinatorStub(self.channel)  # type: ignore[no-untyped-call, unused-ignore]
        #: AgentLocal's address as the node's ranks reach it; set before the first contact.
        self.endpoint = ""
        self.node_id: str | None = None
        self.heartbeat_interval_s = 1.0
        self.backoff = Backoff()
        self._next_contact = 0.0
        self._unreachable_logged = False
        self._reregister = False

    def update_profile(self, profile: NodeProfile) -> None:
        """Register ``profile`` (same node, new device scores) at the next contact."""
        self.profile = profile
        self._reregister = True

    def due(self) -> bool:
        """Whether it is time for the next heartbeat (or retry)."""
        return time.perf_counter() >= self._next_contact

    def contact(self) -> pb.PollAssignmentsResponse | None:
        """Register if needed, heartbeat, and poll if the reply says orders may be
        pending: the orders, or None if none were polled or the call failed (then
        the next contact is after the backoff's delay)."""
        try:
            if self.node_id is None or self._reregister:
                self._register()
            orders = self._heartbeat_and_poll()
        except grpc.RpcError as exc:
            if self.node_id is not None and is_unreachable(exc):
                snapshot = self.telemetry.latest()
                self.outbox.keep_telemetry(snapshot.heartbeat(self.node_id), snapshot.time_unix_s)
            self._failed(exc)
            return None
        if self._unreachable_logged:
            log.info("coordinator %s reachable again", self.config.coordinator)
            self._unreachable_logged = False
        self.backoff.succeeded()
        self._next_contact = time.perf_counter() + self.heartbeat_interval_s
        return orders

    def close(self) -> None:
        self.channel.close()

    def _failed(self, exc: grpc.RpcError) -> None:
        error = remote_error(exc, f"coordinator {self.config.coordinator}")
        if isinstance(error, UnknownNameError) and self.node_id is not None:
            log.warning(
                "coordinator does not know node %s (database reset?): registering again",
                self.node_id,
            )
            self.node_id = None
            self._next_contact = time.perf_counter()
            return
        delay = self.backoff.failed()
        unreachable = isinstance(error, UnreachableError)
        if not self._unreachable_logged or not unreachable:
            log.warning(
                "coordinator %s: %s (%s); retrying in %.1f s",
                self.config.coordinator,
                error.status,
                error,
                delay,
            )
            self._unreachable_logged = unreachable
        self._next_contact = time.perf_counter() + delay

    def _register(self) -> None:
        profile = self.profile
        try:
            if not self._reregister or profile.network_rtt_s is None:  # not for a new score
                net = measure_network(self.stub, timeout_s=CALL_TIMEOUT_S)
                profile = replace(
                    profile, network_rtt_s=net.rtt_s, network_bytes_per_s=net.bytes_per_s
                )
        except grpc.RpcError as exc:
            if not isinstance(remote_error(exc, "the coordinator"), UnsupportedError):
                raise
        resp = self.stub.RegisterNode(
            pb.RegisterNodeRequest(
                name=self.config.node_name,
                address=self.config.address or outbound_address(self.config.coordinator),
                agent_endpoint=self.endpoint,
                agent_version=__version__,
                devices=profile.device_messages(),
                host=profile.host_message(),
            ),
            timeout=CALL_TIMEOUT_S,
        )
        self.profile = profile
        self.node_id = resp.node_id
        self._reregister = False
        self.heartbeat_interval_s = resp.heartbeat_interval_s or 1.0
        if resp.heartbeat_timeout_s:
            # Retry often enough to be heard within the timeout once the coordinator is back.
            self.backoff.max_s = max(0.5, min(30.0, resp.heartbeat_timeout_s / 2))
        rtt = f"{profile.network_rtt_s * 1e3:.2f} ms" if profile.network_rtt_s else "n/a"
        log.info(
            "registered as node %s (%s), %d device(s), heartbeat every %.1f s, rtt %s%s",
            self.node_id,
            self.config.node_name,
            len(profile.devices),
            self.heartbeat_interval_s,
            rtt,
            f", EMULATED slowdown {profile.emulated_slowdown:g}x" if profile.emulated else "",
        )

    def _heartbeat_and_poll(self) -> pb.PollAssignmentsResponse | None:
        assert self.node_id is not None
        beat = self.stub.Heartbeat(
            self.telemetry.latest().heartbeat(self.node_id), timeout=CALL_TIMEOUT_S
        )
        if not orders_pending(beat):
            return None
        return self._poll_pages()

    def _poll_pages(self) -> pb.PollAssignmentsResponse:
        """Every page of the node's orders, as one response (a page holds whole jobs, so
        merging keeps each job's launches together). A coordinator that predates paging
        sends no token: one page. A page that fails after the first ends the poll with
        what arrived; the rest comes again at the next contact."""
        assert self.node_id is not None
        merged = pb.PollAssignmentsResponse()
        token = ""
        for page_number in range(MAX_ORDER_PAGES):
            request = pb.PollAssignmentsRequest(node_id=self.node_id, page_token=token)
            try:
                page: pb.PollAssignmentsResponse = self.stub.PollAssignments(
                    request, timeout=CALL_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                if page_number == 0:
                    raise
                log.warning(
                    "orders page %d: %s; the rest at the next poll", page_number + 1, exc.code()
                )
                break
            merged.launches.extend(page.launches)
            merged.stops.extend(page.stops)
            token = page.next_page_token
            if not token:
                break
        return merged
