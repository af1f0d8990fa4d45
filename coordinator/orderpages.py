"""``PollAssignments`` a page at a time, within the caller's deadline.

With ten thousand jobs placed on one node, one reply with every launch order took
14 s to build, past the agent's 5 s deadline, so the node never got its orders
and the server kept building replies for callers that had gone. Now a reply
holds at most ``limit`` orders (launches first, then stops), the agent asks for
the next page with ``next_page_token``, and a page is cut short (still a valid
page, with a token for the rest) when the call's deadline is near.

The token is the key of the last order sent (``store.orders``' keyset paging),
as text: ``L <submitted> <job id>`` while launches remain, ``S <job id> <rank>``
once only stops do. It holds no secret and names nothing the caller may not
read; a token that does not parse is INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from hetero.coordinator import store, wire
from hetero.coordinator.models import PlanRow
from hetero.coordinator.rpc import invalid
from hetero.coordinator.store.orders import LaunchKey, StopKey
from hetero.v1 import coordinator_pb2 as pb

#: Orders a page holds when the request names no limit, and at most.
DEFAULT_PAGE = 256
MAX_PAGE = 2048
#: Seconds before the caller's deadline at which a page is closed and sent as it is.
DEADLINE_MARGIN_S = 0.5


def decode(token: str) -> tuple[LaunchKey | None, StopKey | None]:
    """(launch key, None) to go on with launches, (None, stop key) for stops only,
    (None, None) for the first page."""
    if not token:
        return None, None
    parts = token.split(" ")
    try:
        if parts[0] == "L" and len(parts) == 3:
            return (float(parts[1]), parts[2]), None
        if parts[0] == "S" and len(parts) == 3:
            return None, (parts[1], int(parts[2]))
    except ValueError:
        pass
    raise invalid(f"page_token: not a token of this coordinator: {token[:40]!r}")


def page_limit(limit: int) -> int:
    if limit < 0:
        raise invalid(f"limit must be >= 0, got {limit}")
    return min(limit or DEFAULT_PAGE, MAX_PAGE)


def poll_page(
    s: Session, node_id: str, token: str, limit: int, time_left: Callable[[], float | None]
) -> pb.PollAssignmentsResponse:
    """One page of ``node_id``'s orders after ``token``; ``time_left()`` is the seconds
    to the caller's deadline (None = none), checked before each job's launches."""
    launch_after, stop_after = decode(token)
    room = page_limit(limit)
    out = pb.PollAssignmentsResponse()
    if stop_after is None:
        rows = store.ranks_to_launch(s, node_id, after=launch_after, limit=room)
        last: LaunchKey | None = None
        plan: PlanRow | None = None
        for rank in rows:
            job = rank.job
            if last is None or job.id != last[1]:
                left = time_left()
                if last is not None and left is not None and left < DEADLINE_MARGIN_S:
                    out.next_page_token = token_after(last)
                    return out  # the jobs so far, whole; the caller asks again for the rest
                last, plan = (job.submitted_at_unix_s, job.id), store.latest_plan(s, job.id)
            assert plan is not None  # set with ``last`` above
            out.launches.append(wire.launch_message(job, rank, store.spec_of(job), plan))
        if last is not None and len(rows) >= room:
            out.next_page_token = token_after(last)
            return out
        room -= len(rows)
    stops = store.ranks_to_stop(s, node_id, after=stop_after, limit=room)
    for rank in stops:
        out.stops.add(
            job_id=rank.job_id, rank=rank.rank, reason=rank.job.message, attempt=rank.job.restarts
        )
    if len(stops) >= room:
        out.next_page_token = f"S {stops[-1].job_id} {stops[-1].rank}"
    return out


def token_after(key: LaunchKey) -> str:
    """The token of the page after the job whose launches end at ``key``."""
    return f"L {key[0]!r} {key[1]}"
