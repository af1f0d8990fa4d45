"""``ListJobs`` a page at a time: with ten thousand jobs queued, one reply with every
job is megabytes and seconds; a page is ``limit`` jobs, newest first, and
``next_page_token`` names where the next one starts.

The token is the last job's key in the listing's order (``store.list_jobs``'
keyset paging), as text: ``J <submitted, Unix s> <job id>``. A job submitted
while a client pages lands on the first page, never twice in one listing; one
that ends moves nowhere (the order is by submission). The token holds no secret
and names nothing the caller may not read; one that does not parse is
INVALID_ARGUMENT.
"""

from __future__ import annotations

from hetero.coordinator.models import JobRow
from hetero.coordinator.store import JobKey
from hetero.core.errors import ConfigError

#: Jobs a page holds when the request names no limit, and at most.
DEFAULT_PAGE = 100
MAX_PAGE = 1000


def page_limit(limit: int) -> int:
    if limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    return min(limit or DEFAULT_PAGE, MAX_PAGE)


def encode(last: JobRow) -> str:
    # repr: the float's shortest text that reads back as the same float.
    return f"J {last.submitted_at_unix_s!r} {last.id}"


def decode(token: str) -> JobKey | None:
    """The key the page starts after; None for the first page."""
    if not token:
        return None
    parts = token.split(" ")
    if len(parts) == 3 and parts[0] == "J" and parts[2]:
        try:
            return float(parts[1]), parts[2]
        except ValueError:
            pass
    raise ConfigError(f"page_token: not a token of this coordinator: {token[:40]!r}")
