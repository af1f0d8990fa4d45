"""How a job's failure names the rank that caused it, written once.

The coordinator says why a job failed in one line (``Job.message``, and the job's
``failed`` event), made by :func:`rank_exit_cause` when a rank exited non-zero
(``coordinator.lifecycle``); ``hetero-coord submit --wait`` reads the rank back
with :func:`failed_rank` to show that rank's last output lines. The rank is named
in the message because only the coordinator saw which exit came first: the ranks
it stopped afterwards exit non-zero too.
"""

from __future__ import annotations

import re

_RANK_EXIT = re.compile(r"\brank (\d+) exited with code -?\d+")


def rank_exit_cause(rank: int, exit_code: int, why: str = "") -> str:
    """ "rank 1 exited with code 2", with the agent's reason in parentheses when it gave
    one ("rank 1 exited with code 137 (no progress for 300 s: killed by the watchdog)")."""
    cause = f"rank {rank} exited with code {exit_code}"
    return f"{cause} ({why})" if why else cause


def failed_rank(message: str) -> int | None:
    """The rank a failure message from :func:`rank_exit_cause` names; None for a failure
    no single rank's exit caused (a node went down, a cancel)."""
    found = _RANK_EXIT.search(message)
    return int(found.group(1)) if found else None
