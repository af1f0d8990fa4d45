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

Freezing is not enough for a server whose state is made after start-up. The
one-process coordinator holds its cluster in memory: with 1,000 agents' order
streams open it tracks another ~124,000 objects (each stream's task, futures
and gRPC call state, the nodes and their devices, the jobs' interval
histories). Python starts a full collection once a quarter of that many
objects have been promoted out of the young generations, and at Python's
default of a young collection every 700 allocations every one of them caught
the objects of the calls then in flight and promoted them: under the load above
a full collection ran every 2.5 s, 40 to 175 ms each (44 in 60 s, gc
callbacks timed in the process). ``settle`` therefore also lets the young
generation grow to :data:`YOUNG_ALLOCATIONS` before it is collected: a call's
objects are then nearly always freed by reference counting first, young
collections are 28 times rarer and each walks a few milliseconds' worth, and
the same run had 2 full collections in its 60 s. Nothing is kept longer than
before: only unreachable cycles wait for a collection, and they wait for fewer
allocations than a heartbeat makes in a second.
"""

from __future__ import annotations

import gc

#: Net allocations between young collections in a settled daemon (Python's default: 700).
YOUNG_ALLOCATIONS = 20_000


def settle() -> int:
    """Collect start-up's garbage, exempt the survivors from later collections and let
    the young generation grow to :data:`YOUNG_ALLOCATIONS`; returns how many objects
    were frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_ALLOCATIONS, older, oldest)
    return gc.get_freeze_count()
