"""The agent's link to the coordinator: register, heartbeat (the node's lease), back off;
and the stream of the node's orders (``OrderStream``).

An agent whose state directory (or token file) lies in one of the coordinator's
allowed roots, where jobs write, refuses to run: registering raises ``ConfigError``.
The coordinator being down at start or later is never fatal: calls are retried
with exponential backoff and jitter (capped at half the heartbeat timeout, so a
restarted coordinator hears from every agent before it would call one down, and
its agents do not all call in the same instant), and telemetry sampled meanwhile
waits in the outbox (``agent.outbox``). A coordinator that no longer knows the
node (its database was reset) gets a fresh registration. One that refuses the
agent's token is retried the same way, after one line that says which token was
sent, where it came from and how to give the right one (``refused_token_hint``).
Orders are pushed: one ``WatchOrders`` stream per agent, on a thread of its own,
opened again with backoff and jitter whenever it ends.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field, replace

import grpc

from hetero import __version__
from hetero.agent.config import AgentConfig, outbound_address
from hetero.agent.network import CHANNEL_OPTIONS, measure_network
from hetero.agent.outbox import Outbox
from hetero.agent.profile import NodeProfile
from hetero.agent.telemetry import TelemetrySampler
from hetero.core.errors import UnknownNameError, UnreachableError
from hetero.core.roots import check_private
from hetero.security.auth import local_token_path
from hetero.security.transport import (
    ClientSecurity,
    client_channel,
    is_loopback,
    is_unreachable,
    remote_error,
)
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("hetero.agent")

#: Seconds each coordinator call may take.
CALL_TIMEOUT_S = 5.0


@dataclass
class Backoff:
    """Exponential retry delay in seconds: ``initial_s`` doubling up to ``max_s``
    (``delay_s``), of which each retry waits a random fraction in [1 - ``jitter``, 1]:
    never longer than the cap, and agents refused together do not retry together."""

    initial_s: float = 0.5
    max_s: float = 30.0
    delay_s: float = 0.0
    failures: int = 0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random)

    def failed(self) -> float:
        """Count a failure; the seconds to wait before the next try."""
        self.failures += 1
        self.delay_s = min(self.max_s, self.initial_s * 2 ** (self.failures - 1))
        return self.delay_s * self.rng.uniform(1.0 - self.jitter, 1.0)

    def succeeded(self) -> None:
        self.failures, self.delay_s = 0, 0.0


def refused_token_hint(coordinator: str, node: str, security: ClientSecurity) -> str:
    """One line for an agent whose token the coordinator refused (UNAUTHENTICATED): which
    token it sent and where that came from, and how to give it the right one."""
    fix = (
        "give it the coordinator's token (a copy of the coordinator's token file, "
        f"mode 0600) or node {node}'s own credential (hetero-coord node-token {node} "
        "--out FILE), as --token-file FILE or token_file: in agent.yaml"
    )
    if security.token is None:
        local = f", nor a readable {local_token_path()}" if is_loopback(coordinator) else ""
        return (
            f"coordinator {coordinator} requires a token and this agent has none "
            f"(no --token-file, $HETERO_TOKEN_FILE or $HETERO_TOKEN{local}): {fix}"
        )
    source = security.token_source or "the token given"
    return f"coordinator {coordinator} refused this agent's token, from {source}: {fix}"


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
        self.security = security
        self.channel = client_channel(config.coordinator, security, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.CoordinatorStub(self.channel)  # type: ignore[no-untyped-call, unused-ignore]
        #: AgentLocal's address as the node's ranks reach it; set before the first contact.
        self.endpoint = ""
        self.node_id: str | None = None
        self.heartbeat_interval_s = 1.0
        self.backoff = Backoff()
        self._next_contact = 0.0
        self._unreachable_logged = False
        self._refused_logged = False
        self._reregister = False

    def update_profile(self, profile: NodeProfile) -> None:
        """Register ``profile`` (same node, new device scores) at the next contact."""
        self.profile = profile
        self._reregister = True

    def due(self) -> bool:
        """Whether it is time for the next heartbeat (or retry)."""
        return time.perf_counter() >= self._next_contact

    def contact(self) -> bool:
        """Register if needed, and heartbeat; False if a call failed (then the next
        contact is after the backoff's delay)."""
        try:
            if self.node_id is None or self._reregister:
                self._register()
            self._heartbeat()
        except grpc.RpcError as exc:
            if self.node_id is not None and is_unreachable(exc):
                snapshot = self.telemetry.latest()
                self.outbox.keep_telemetry(snapshot.heartbeat(self.node_id), snapshot.time_unix_s)
            self._failed(exc)
            return False
        if self._unreachable_logged:
            log.info("coordinator %s reachable again", self.config.coordinator)
            self._unreachable_logged = False
        if self._refused_logged:
            log.info("coordinator %s accepted the token", self.config.coordinator)
            self._refused_logged = False
        self.backoff.succeeded()
        self._next_contact = time.perf_counter() + self.heartbeat_interval_s
        return True

    def forget_node(self) -> None:
        """The coordinator does not know this node: register again at the next contact."""
        if self.node_id is not None:
            log.warning(
                "coordinator does not know node %s (database reset?): registering again",
                self.node_id,
            )
        self.node_id = None
        self._next_contact = time.perf_counter()

    def close(self) -> None:
        self.channel.close()

    def _failed(self, exc: grpc.RpcError) -> None:
        error = remote_error(exc, f"coordinator {self.config.coordinator}")
        if isinstance(error, UnknownNameError) and self.node_id is not None:
            self.forget_node()
            return
        delay = self.backoff.failed()
        unreachable = isinstance(error, UnreachableError)
        if error.status == "UNAUTHENTICATED":
            if not self._refused_logged:  # once: it will not change until someone fixes it
                log.warning(
                    refused_token_hint(
                        self.config.coordinator, self.config.node_name, self.security
                    )
                    + f"; retrying, at most every {self.backoff.max_s:g} s"
                )
                self._refused_logged = True
        elif not self._unreachable_logged or not unreachable:
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
        if not self._reregister or profile.network_rtt_s is None:  # not for a new score
            net = measure_network(self.stub, timeout_s=CALL_TIMEOUT_S)
            profile = replace(profile, network_rtt_s=net.rtt_s, network_bytes_per_s=net.bytes_per_s)
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
        # A job may write anywhere in the coordinator's allowed roots, as this agent's
        # user: the agent's token and rank records must lie in none of them.
        check_private(self.config.private_paths, resp.allowed_roots)
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

    def _heartbeat(self) -> None:
        assert self.node_id is not None
        self.stub.Heartbeat(self.telemetry.latest().heartbeat(self.node_id), timeout=CALL_TIMEOUT_S)


class OrderStream:
    """The node's orders as the coordinator pushes them (``WatchOrders``), received on a
    thread of its own and handed to the agent's loop (``take``), which carries them out:
    it starts and stops the ranks itself. The stream is opened once the node is
    registered and again whenever it ends, after a backoff with jitter (so a thousand
    agents do not come back in the same instant after a coordinator restart); a
    coordinator that does not know the node makes the link register again."""

    def __init__(self, link: CoordinatorLink, probe: tuple[int, bytes] | None = None) -> None:
        """``probe``: where this agent answers link probes, (port, token), announced on
        every stream it opens (``agent.peerlinks``); None: it answers none."""
        self.link = link
        self._probe = probe
        self.backoff = Backoff(initial_s=0.5, max_s=10.0)
        self._orders: queue.Queue[pb.Orders] = queue.Queue()
        self._stopping = threading.Event()
        self._call: object = None
        self._thread = threading.Thread(target=self._run, name="orders", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        call = self._call
        if call is not None:
            call.cancel()  # type: ignore[attr-defined]
        self._thread.join(timeout=5.0)

    def take(self) -> list[pb.Orders]:
        """The orders received since the last call, oldest first."""
        out = []
        while True:
            try:
                out.append(self._orders.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        while not self._stopping.is_set():
            node_id = self.link.node_id
            if node_id is None:
                self._stopping.wait(0.2)
                continue
            try:
                port, token = self._probe or (0, b"")
                request = pb.WatchOrdersRequest(
                    node_id=node_id, peer_probe_port=port, peer_probe_token=token
                )
                call = self.link.stub.WatchOrders(request)
                self._call = call
                for orders in call:
                    self.backoff.succeeded()
                    self._orders.put(orders)
            except grpc.RpcError as exc:
                if self._stopping.is_set():
                    return
                error = remote_error(exc, f"coordinator {self.link.config.coordinator}")
                if isinstance(error, UnknownNameError) and self.link.node_id == node_id:
                    self.link.forget_node()
                log.debug("order stream ended (%s)", error)
            except ValueError as exc:  # the stub's channel closed under it: another comes
                if self._stopping.is_set():
                    return
                log.debug("order stream ended (%s)", exc)
            finally:
                self._call = None
            self._stopping.wait(self.backoff.failed())
