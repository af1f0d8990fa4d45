"""Long-lived daemons and Python's full garbage collections.

Python's cyclic collector walks every object it tracks in a full (generation 2)
collection, holding the interpreter lock the whole time. A coordinator tracks
about 125,000 objects once it has started (modules, classes, functions, the
tables of SQLAlchemy and gRPC), nearly all of which live as long as the
process. Under ``hetero-bench load --agents 1000 --ranks 256 --queued 10000`` on
a 2-core box a full collection ran every few seconds, each taking 50 to 100 ms
of wall time, and every heartbeat that arrived meanwhile waited for it: the
bursts of heartbeats slower than 50 ms in the generators' latencies fell on
those collections (gc callbacks timed in the coordinator's process).

``settle`` is called once a daemon has started: it collects what start-up left
behind, then moves every surviving object into the permanent generation
(``gc.freeze``), which collections skip. Objects made afterwards are collected
as before, and reference counting still frees every object, frozen or not, the
moment its last reference goes; what freezing gives up is only the cyclic
collection of start-up's objects, which live until the process exits anyway.
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Collect start-up's garbage, then exempt the survivors from later collections;
    returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
