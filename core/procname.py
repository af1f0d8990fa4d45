"""A process's short name (``/proc/PID/comm``): what ``top``, ``ps -o comm`` and
``psutil.Process.name()`` show, so an operator can tell the coordinator's worker
processes apart (``hetero-report``, ``hetero-metrics``) where their command lines
all read ``python -c from multiprocessing.spawn import ...``.

Linux's ``prctl(PR_SET_NAME)`` names the calling thread; called on a process's main
thread it is the process's name. Elsewhere, and where libc cannot be loaded, names
stay as they are: a name is a convenience, never a condition.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15
#: Bytes the kernel keeps of a name (16 with the terminating NUL).
MAX_LEN = 15


def set_name(name: str) -> None:
    """Name the calling thread (the process, on its main thread); cut to ``MAX_LEN``."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:MAX_LEN], 0, 0, 0)
    except (OSError, AttributeError):
        return
