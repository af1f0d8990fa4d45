"""A node's orders, as its agent's stream (``WatchOrders``) sends them.

The orders of a node are computed from the state: the launches of the ranks placed on
it that its agent has not reported started (of jobs not finished), by (submission, job
id, rank), and the stops of its ranks ordered to stop and not confirmed, by (job id,
rank). A stream sends each order once (``OrderStream``): all of them when it opens,
then those that are new each time the node's orders change; an order carries its job's
attempt, so a restart's launches are new orders. A message holds at most
:data:`MESSAGE_ORDERS` orders and never splits a job's launches (an agent sizes their
CPU threads by how many of the job's ranks it runs).

The last message of each burst also carries the node's *wanted* ranks: (job, rank,
attempt) of every rank placed there, of jobs not finished, not ordered to stop. A
burst is sent when they change too, so an agent that was cut off or declared down
learns, when its stream delivers again (or opens again), which of its ranks ended,
were cancelled or moved to another attempt or node meanwhile, and stops them: a node
that was lost has no stop order of its own (its ranks count as gone at once,
``lifecycle.rank_state_when_node_lost``).

The last message of a burst also carries the links the node is to measure
(``peerlinks``), each sent once, by the first of its streams to look.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.coordinator import lifecycle, messages, peerlinks
from hetero.coordinator.state import ClusterState, Job, Rank
from hetero.v1 import coordinator_pb2 as pb

#: Orders one message holds at most (a job's launches on the node are never split).
MESSAGE_ORDERS = 256
#: Rank states of a rank its node should run: not started yet, or running.
WANTED = frozenset({lifecycle.ASSIGNED, lifecycle.RUNNING})
#: An order as a stream remembers it: (kind, job id, rank, attempt).
Key = tuple[str, str, int, int]
#: A rank of one attempt of a job: (job id, rank, attempt).
RankKey = tuple[str, int, int]


@dataclass(frozen=True)
class NodeOrders:
    """A node's launches (ranks placed there not started yet, of jobs not finished) by
    (submission, job id, rank), its stops (ranks ordered to stop, not confirmed) by
    (job id, rank), and the ranks it should run (launched or not)."""

    launches: list[tuple[Job, Rank]]
    stops: list[tuple[Job, Rank]]
    wanted: frozenset[RankKey]


def orders_of(state: ClusterState, node_id: str) -> NodeOrders:
    launches, stops, wanted = [], [], set()
    for job in state.unqueued():
        for r in job.ranks:
            if r.node_id != node_id:
                continue
            if r.state == lifecycle.STOPPING:
                stops.append((job, r))
            elif r.state in WANTED and not job.finished:
                wanted.add((job.id, r.rank, job.restarts))
                if r.state == lifecycle.ASSIGNED:
                    launches.append((job, r))
    launches.sort(key=lambda o: (o[0].submitted_at_unix_s, o[0].id, o[1].rank))
    stops.sort(key=lambda o: (o[0].id, o[1].rank))
    return NodeOrders(launches, stops, frozenset(wanted))


class OrderStream:
    """What one stream has sent, and what to send next."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._sent: set[Key] = set()
        self._wanted: frozenset[RankKey] | None = None

    def new(self, state: ClusterState, now: float) -> list[pb.Orders]:
        """The messages of the node's orders this stream has not sent (none: []), the last
        one marked ``complete`` and carrying the wanted ranks; the first call always
        returns a burst, and so does a change of the wanted ranks alone."""
        orders = orders_of(state, self.node_id)
        current = {_key("L", o) for o in orders.launches} | {_key("S", o) for o in orders.stops}
        self._sent &= current  # done orders are forgotten: a later one of them is new
        launches = [o for o in orders.launches if _key("L", o) not in self._sent]
        stops = [o for o in orders.stops if _key("S", o) not in self._sent]
        out: list[pb.Orders] = []
        while launches:
            page = _whole_jobs(launches, MESSAGE_ORDERS)
            launches = launches[len(page) :]
            out.append(pb.Orders(launches=[messages.launch_message(j, r) for j, r in page]))
        for i in range(0, len(stops), MESSAGE_ORDERS):
            msg = pb.Orders()
            for job, r in stops[i : i + MESSAGE_ORDERS]:
                msg.stops.add(job_id=job.id, rank=r.rank, reason=job.message, attempt=job.restarts)
            out.append(msg)
        if not out and orders.wanted != self._wanted:
            out.append(pb.Orders())  # the first burst says "nothing to do" too
        probes = peerlinks.take_orders(state, self.node_id)
        if probes:
            if not out:
                out.append(pb.Orders())
            out[-1].measure_links.extend(probes)
        for msg in out:
            msg.sent_at_unix_s = now
        if out:
            out[-1].complete = True
            wanted = out[-1].wanted
            wanted.SetInParent()  # present, even empty: "run nothing"
            for job_id, rank, attempt in sorted(orders.wanted):
                wanted.ranks.add(job_id=job_id, rank=rank, attempt=attempt)
        self._sent, self._wanted = current, orders.wanted
        return out


def _key(kind: str, order: tuple[Job, Rank]) -> Key:
    job, rank = order
    return (kind, job.id, rank.rank, job.restarts)


def _whole_jobs(launches: list[tuple[Job, Rank]], room: int) -> list[tuple[Job, Rank]]:
    """The first ``room`` launches, cut at a job's boundary; a first job with more ranks
    than a page holds is sent whole, alone."""
    if len(launches) <= room:
        return launches
    cut = launches[room - 1][0].id
    if launches[room][0].id != cut:
        return launches[:room]
    whole = [o for o in launches[:room] if o[0].id != cut]
    return whole or [o for o in launches if o[0].id == cut]
