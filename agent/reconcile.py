"""The agent's reconciler: the coordinator's orders carried out as ranks on this node.

A launch order starts a rank under the supervisor (with its command and
environment from ``agent.orders``) unless it was carried out already; a stop
order ends one. Each launch carries its job's attempt number: a rank of an
earlier attempt still running here is stopped first, and the launch waits until
that process has ended (``retry``, every tick of the agent's loop). Every start,
failure to start and exit is queued with the shipper for the coordinator.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from hetero.agent.config import AgentConfig
from hetero.agent.local import PlanCache
from hetero.agent.orders import rank_process
from hetero.agent.shipper import Shipper
from hetero.agent.supervisor import Supervisor
from hetero.core import cpus
from hetero.core.errors import ConfigError
from hetero.security.auth import JobTokens
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.agent")


class Reconciler:
    """Launches and stops this node's ranks as ordered. ``endpoint`` is AgentLocal's
    address, given to every rank with its job's token from ``job_tokens``."""

    def __init__(
        self,
        config: AgentConfig,
        supervisor: Supervisor,
        plans: PlanCache,
        shipper: Shipper,
        *,
        endpoint: str,
        job_tokens: JobTokens | None,
    ) -> None:
        self.config = config
        self.supervisor = supervisor
        self.plans = plans
        self.shipper = shipper
        self.endpoint = endpoint
        self.job_tokens = job_tokens
        #: (job, rank, attempt) of every launch order carried out.
        self.launched: set[tuple[str, int, int]] = set()
        #: Launches waiting for a rank of an earlier attempt to end, with the ranks of
        #: their job on this node.
        self.waiting: dict[tuple[str, int], tuple[pb.RankLaunch, int]] = {}

    def carry_out(self, orders: pb.Orders) -> None:
        """Launch the ordered ranks not launched yet, then stop those ordered to stop."""
        per_job: dict[str, int] = defaultdict(int)
        for order in orders.launches:
            per_job[order.job_id] += 1
        for order in orders.launches:
            if (order.job_id, order.rank, order.attempt) not in self.launched:
                self.launch(order, per_job[order.job_id])
        for stop in orders.stops:
            self.stop_rank(stop)

    def retry(self) -> None:
        """Launch what waited for an earlier attempt's rank that has ended since."""
        for (job_id, rank), (order, local) in list(self.waiting.items()):
            if self.supervisor.attempt_of(job_id, rank) is None:
                del self.waiting[(job_id, rank)]
                self.launch(order, local)

    def _threads(self, order: pb.RankLaunch) -> int:
        if order.device_kind == tpb.DEVICE_KIND_CUDA:
            return max(1, cpus.usable() // 8)
        if self.config.cpu_threads:
            return self.config.cpu_threads
        cpu_ranks = 1 + len(self.supervisor.workers)
        return max(1, cpus.usable() // cpu_ranks)

    def launch(self, order: pb.RankLaunch, local_world_size: int) -> None:
        older = self.supervisor.attempt_of(order.job_id, order.rank)
        if older is not None:
            # A rank of an earlier attempt is still here (this node was cut off while
            # the job restarted): end it first; the launch waits for it to be gone.
            if older < order.attempt:
                self.supervisor.stop(order.job_id, order.rank, self.config.stop_grace_s)
                self.waiting[(order.job_id, order.rank)] = (order, local_world_size)
            return
        self.launched.add((order.job_id, order.rank, order.attempt))
        self.plans.offer(order.plan)
        out_dir = self.supervisor.job_dir(order.job_id) / f"rank{order.rank}"
        progress = out_dir / "progress"
        try:
            process = rank_process(
                order,
                python=self.config.python,
                output_dir=out_dir,
                agent_endpoint=self.endpoint,
                threads=self._threads(order),
                local_world_size=local_world_size,
                agent_token=self.job_tokens.for_job(order.job_id) if self.job_tokens else None,
                progress_file=progress,
            )
        except ConfigError as exc:  # a value no rank could read: fail the rank, not the agent
            log.error("job %s rank %d: bad launch order: %s", order.job_id, order.rank, exc)
            self.shipper.queue(
                order.job_id,
                order.rank,
                pb.RANK_STATE_EXITED,
                2,
                f"bad launch order: {exc}",
                order.attempt,
            )
            return
        emu = (
            f" (EMULATED slowdown {order.emulated_slowdown:g}x)"
            if order.emulated_slowdown > 1
            else ""
        )
        attempt = order.attempt
        try:
            self.supervisor.launch(
                order.job_id,
                order.rank,
                process.argv,
                process.env,
                out_dir,
                attempt=attempt,
                progress_file=progress,
            )
        except OSError as exc:
            log.error(
                "job %s rank %d: cannot start %s: %s",
                order.job_id,
                order.rank,
                process.argv[0],
                exc,
            )
            self.shipper.queue(
                order.job_id, order.rank, pb.RANK_STATE_EXITED, 127, f"cannot start: {exc}", attempt
            )
            return
        again = f" (attempt {attempt})" if attempt else ""
        log.info(
            "job %s rank %d/%d launched%s%s", order.job_id, order.rank, order.world_size, again, emu
        )
        self.shipper.queue(order.job_id, order.rank, pb.RANK_STATE_RUNNING, None, "", attempt)

    def stop_rank(self, stop: pb.RankStop) -> None:
        if self.supervisor.stop(stop.job_id, stop.rank, self.config.stop_grace_s):
            return
        if not any(s.job_id == stop.job_id and s.rank == stop.rank for s in self.shipper.statuses):
            # Not running here (ended, or started by an earlier agent): confirm it is gone.
            self.shipper.queue(
                stop.job_id,
                stop.rank,
                pb.RANK_STATE_EXITED,
                143,
                "not running on this node",
                stop.attempt,
            )

    def reap(self) -> None:
        for e in self.supervisor.poll():
            self.shipper.queue_exit(e, e.reason or ("stopped by the agent" if e.stopped else ""))
        self.retry()
