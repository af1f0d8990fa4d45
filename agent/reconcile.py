"""The agent's reconciler: the coordinator's orders carried out as ranks on this node.

A launch order starts a rank under the supervisor (with its command and
environment from ``agent.orders``) unless it was carried out already; a stop
order ends one. Each burst of orders ends with the ranks the coordinator wants on
this node (``Orders.wanted``): every rank running here that is not among them is
stopped. That is how a node that was cut off or declared down, and comes back,
ends the ranks of jobs that ended, were cancelled, or moved to another attempt or
node meanwhile: the coordinator counted them gone and sends them no stop order.

Nothing runs twice on a device: a launch waits (``retry``, every tick of the
agent's loop) while a rank of an earlier attempt of its job is still here (stopped
first), or, on a CUDA device, while a rank being stopped still holds that device.
Every start, failure to start and exit is queued with the shipper for the
coordinator.
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
        #: Launches waiting for a rank they must not run beside to end (``_blocked``),
        #: with the ranks of their job on this node.
        self.waiting: dict[tuple[str, int], tuple[pb.RankLaunch, int]] = {}

    def carry_out(self, orders: pb.Orders) -> None:
        """Stop the ranks not wanted (if the message says which are), launch the ordered
        ranks not launched yet, then stop those ordered to stop."""
        if orders.HasField("wanted"):
            self.stop_unwanted(orders.wanted)
        per_job: dict[str, int] = defaultdict(int)
        for order in orders.launches:
            per_job[order.job_id] += 1
        for order in orders.launches:
            if (order.job_id, order.rank, order.attempt) not in self.launched:
                self.launch(order, per_job[order.job_id])
        for stop in orders.stops:
            self.stop_rank(stop)

    def stop_unwanted(self, wanted: pb.NodeRanks) -> None:
        """Stop every rank running here that ``wanted`` lacks, and forget the launches
        waiting for a device that it lacks (their job ended or moved meanwhile)."""
        keep = {(r.job_id, r.rank, r.attempt) for r in wanted.ranks}
        for key, (order, _) in list(self.waiting.items()):
            if (order.job_id, order.rank, order.attempt) not in keep:
                del self.waiting[key]
        for w in list(self.supervisor.workers.values()):
            if (w.job_id, w.rank, w.attempt) in keep or w.stopping:
                continue
            log.warning(
                "job %s rank %d (attempt %d) is no longer wanted on this node (its job "
                "ended or moved while the coordinator did not hear from it): stopping it",
                w.job_id,
                w.rank,
                w.attempt,
            )
            self.supervisor.stop(w.job_id, w.rank, self.config.stop_grace_s)

    def retry(self) -> None:
        """Launch what waited for a rank that has ended since."""
        for key, (order, local) in list(self.waiting.items()):
            if not self._blocked(order):
                del self.waiting[key]
                self.launch(order, local)

    def _blocked(self, order: pb.RankLaunch) -> bool:
        """Whether a rank ``order`` must not run beside is still here: one of an earlier
        attempt of its job, or, on a CUDA device (one rank each), one being stopped."""
        device = _device(order)
        for w in self.supervisor.workers.values():
            if w.job_id == order.job_id and w.attempt < order.attempt:
                return True
            if w.stopping and w.device == device and order.device_kind == tpb.DEVICE_KIND_CUDA:
                return True
        return False

    def _threads(self, order: pb.RankLaunch) -> int:
        if order.device_kind == tpb.DEVICE_KIND_CUDA:
            return max(1, cpus.usable() // 8)
        if self.config.cpu_threads:
            return self.config.cpu_threads
        cpu_ranks = 1 + len(self.supervisor.workers)
        return max(1, cpus.usable() // cpu_ranks)

    def launch(self, order: pb.RankLaunch, local_world_size: int) -> None:
        current = self.supervisor.attempt_of(order.job_id, order.rank)
        if current is not None and current >= order.attempt:
            return  # launched already (or a later attempt is)
        for w in list(self.supervisor.workers.values()):
            if w.job_id == order.job_id and w.attempt < order.attempt:
                # A rank of an earlier attempt is still here (this node was cut off while
                # the job restarted): end it first; the launch waits for it to be gone.
                self.supervisor.stop(w.job_id, w.rank, self.config.stop_grace_s)
        if self._blocked(order):
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
                device=_device(order),
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


def _device(order: pb.RankLaunch) -> str:
    """The launch's device as the supervisor keys it: "cuda:0", "cpu:0"."""
    kind = "cuda" if order.device_kind == tpb.DEVICE_KIND_CUDA else "cpu"
    return f"{kind}:{order.device_index}"
