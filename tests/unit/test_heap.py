"""``heap.settle``: start-up's objects leave every later full collection, and what is made
afterwards is still collected. Run in a fresh interpreter each: freezing is process-wide."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import gc, weakref
from hetero.core import heap

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    return weakref.ref(a)

before = cycle()  # garbage of start-up: collected by settle, never frozen
frozen = heap.settle()
assert before() is None, "settle left start-up's garbage uncollected"
assert frozen == gc.get_freeze_count() > 1000, frozen
tracked = len(gc.get_objects())
assert tracked < frozen / 5, (tracked, frozen)  # a full collection walks these only
after = cycle()  # made after settle: still collected
gc.collect()
assert after() is None, "a cycle made after settle was not collected"
assert gc.get_threshold()[0] == heap.YOUNG_ALLOCATIONS
later = cycle()  # and without asking: once the young generation has grown
junk = [[i] for i in range(2 * heap.YOUNG_ALLOCATIONS)]
assert later() is None, "a young collection never came"
print("ok", frozen, tracked)
"""


def test_settle_freezes_start_up_and_later_cycles_are_still_collected():
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok ")
