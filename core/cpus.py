"""How many CPUs this process may use: what the kernel lets it run on
(``sched_getaffinity``: a ``taskset``, a cgroup's cpuset, Slurm's binding), not how
many the host has (``os.cpu_count``). A coordinator pinned to 2 cores of a 16-core
host started 4 report workers for its 2 cores, and a rank bound to 4 cores of a
shared host would size its thread pools for all of them."""

from __future__ import annotations

import os


def usable() -> int:
    """The CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)
