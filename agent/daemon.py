"""The agent process's wiring: the link, the reconciler and the shipper on one loop.

One loop thread does the calls to the coordinator and all process management (so
``PR_SET_PDEATHSIG``, which follows the launching thread, holds for the agent's
lifetime). Each tick it contacts the coordinator when due (``agent.link``:
register, heartbeat, back off), carries out the orders its stream has received
(``agent.link.OrderStream``, on a thread of its own; ``agent.reconcile``: launch
and stop ranks; links to measure go to ``agent.peerlinks``' thread), reaps exited
ranks, and
delivers what the node owes the coordinator (``agent.shipper``: the outbox,
rank states, log lines). Telemetry samples on its own thread; ``AgentLocal``
serves trainers from gRPC's pool. The coordinator being down at start or later
is never fatal: state reports are queued and delivered in order once it is
back, and interval reports and telemetry wait in a bounded outbox
(``agent.outbox``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from hetero.agent.config import AgentConfig
from hetero.agent.leftovers import RankRecord
from hetero.agent.link import CoordinatorLink, OrderStream
from hetero.agent.local import AgentLocalService, PlanCache, create_local_server
from hetero.agent.outbox import Outbox
from hetero.agent.peerlinks import PeerLinks
from hetero.agent.profile import NodeProfile
from hetero.agent.reconcile import Reconciler
from hetero.agent.sharing import worth_reregistering
from hetero.agent.shipper import Shipper
from hetero.agent.supervisor import Supervisor
from hetero.agent.telemetry import TelemetrySampler
from hetero.core.nvml import Nvml
from hetero.security.auth import JobTokens, new_token
from hetero.security.transport import ClientSecurity, warn_unverified_coordinator
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.agent")

#: Seconds between loop ticks: how soon an exited rank is noticed.
TICK_S = 0.2


class Agent:
    """One node's agent. ``run()`` blocks until ``stop()``; both are safe to call from tests."""

    def __init__(
        self,
        config: AgentConfig,
        profile: NodeProfile,
        *,
        nvml: Nvml | None = None,
        clock: Callable[[], float] = time.time,
        security: ClientSecurity | None = None,
        leftovers: Sequence[tuple[RankRecord, int]] = (),
    ) -> None:
        """``leftovers``: ranks of a killed predecessor whose processes were ended
        (``RankRecords.end_leftovers``), reported exited once the agent runs."""
        self.config = config
        self.leftovers = list(leftovers)
        self.profile = replace(profile, emulated_slowdown=config.emulate_slowdown)
        self.clock = clock
        self.state_dir = config.resolved_state_dir
        self.security = security or ClientSecurity()
        gpus = [d.index for d in self.profile.devices if d.kind == "cuda"]
        cpus = [d.index for d in self.profile.devices if d.kind != "cuda"]
        self.supervisor = Supervisor(
            self.state_dir,
            clock=clock,
            log_limits=config.rank_logs,
            rank_user=config.rank_account(),
        )
        self.telemetry = TelemetrySampler(
            nvml or Nvml(), gpus, cpu_indexes=cpus, clock=clock, rank_pids=self.supervisor.pids
        )
        self.plans = PlanCache()
        self.outbox = Outbox()
        self.link = CoordinatorLink(
            config, self.profile, self.security, self.telemetry, self.outbox
        )
        self.peers = PeerLinks(config, self.link)  # first: a fixed port may be taken
        # A secured agent guards AgentLocal with a secret of its own, made here, from
        # which each rank gets its job's token: the coordinator's token never reaches
        # job code, and a rank can read and report for its own job only.
        self.job_tokens = JobTokens(new_token()) if self.security.secured else None
        self.local_server, self.local_port = create_local_server(
            config.local_listen,
            AgentLocalService(
                self.link.stub, self.plans, outbox=self.outbox, job_tokens=self.job_tokens
            ),
            insecure=config.insecure,
        )
        host = config.local_listen.rsplit(":", 1)[0]
        self.endpoint = (
            f"{'127.0.0.1' if host in ('', '0.0.0.0', '[::]') else host}:{self.local_port}"
        )
        self.link.endpoint = self.endpoint
        self.orders = OrderStream(self.link, self.peers.endpoint)
        self.shipper = Shipper(config, self.link, self.supervisor, self.plans, self.outbox)
        self.reconciler = Reconciler(
            config,
            self.supervisor,
            self.plans,
            self.shipper,
            endpoint=self.endpoint,
            job_tokens=self.job_tokens,
        )
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.local_server.start()
        self.telemetry.start()
        self.peers.start()
        self.orders.start()
        emu = (
            f", EMULATED slowdown {self.config.emulate_slowdown:g}x"
            if self.profile.emulated
            else ""
        )
        log.info(
            "agent %s: AgentLocal on %s, coordinator %s, state %s%s",
            self.config.node_name,
            self.endpoint,
            self.config.coordinator,
            self.state_dir,
            emu,
        )
        warn_unverified_coordinator(self.config.coordinator, self.security)
        self._report_leftovers()
        try:
            while not self._stop.is_set():
                self._follow_sharing()
                if self.link.due():
                    self.link.contact()
                for orders in self.orders.take():
                    self.peers.measure(orders.measure_links)  # on its own thread
                    self.reconciler.carry_out(orders)
                self.supervisor.watchdog(self.config.watchdog_s)
                self.reconciler.reap()
                # The outbox first, once the coordinator answers again: a job's
                # statistics arrive before the news that it ended.
                if self.link.backoff.failures == 0:
                    self.shipper.deliver_outbox()
                if not self.outbox.pending:
                    self.shipper.flush_statuses()
                self.shipper.ship_logs()
                self._stop.wait(TICK_S)
        finally:
            self._shutdown()

    def _report_leftovers(self) -> None:
        """Report the ranks a killed predecessor left, ended before the profile, exited."""
        self.leftovers += self.supervisor.records.end_leftovers()  # none, unless run() alone
        for rec, n in self.leftovers:
            log.warning(
                "job %s rank %d outlived the last agent: ended %d leftover processes",
                rec.job_id,
                rec.rank,
                n,
            )
            message = f"the agent restarted: ended the rank's {n} leftover processes"
            self.shipper.queue(
                rec.job_id, rec.rank, pb.RANK_STATE_EXITED, 137, message, rec.attempt
            )

    def _follow_sharing(self) -> None:
        """Re-register with lower (or restored) scores when foreign processes' sustained
        use of a GPU changed enough (``agent.sharing``): later placements start from it."""
        devices, changed = [], []
        for d in self.link.profile.devices:
            now = self.telemetry.foreign.utilization_percent(d.index) if d.kind == "cuda" else None
            if now is not None and worth_reregistering(d.foreign_utilization_percent, now):
                changed.append(f"cuda:{d.index} {now:.0f}%")
                d = replace(d, foreign_utilization_percent=now or None)
            devices.append(d)
        if changed:
            log.warning(
                "sustained use by other processes changed (%s): re-registering with "
                "scores divided by 1 + utilization",
                ", ".join(changed),
            )
            self.link.update_profile(replace(self.link.profile, devices=tuple(devices)))

    def _shutdown(self) -> None:
        """Stop every rank (no orphans), tell the coordinator briefly, close the servers."""
        ended = self.supervisor.stop_all(self.config.stop_grace_s)
        for e in ended:
            self.shipper.queue_exit(e, "agent stopped")
        self.shipper.flush_statuses(timeout_s=1.0)
        self.shipper.ship_logs(timeout_s=1.0)
        self.telemetry.stop()
        self.orders.stop()
        self.peers.close()
        self.local_server.stop(0.5).wait()
        self.link.close()
        if self.supervisor.dropped_total:
            log.warning(
                "%d rank output lines were dropped before shipping (each gap noted in the "
                "job's logs)",
                self.supervisor.dropped_total,
            )
        log.info("agent stopped")
