"""A probe for ``hetero-bench load``: put this file's folder on PYTHONPATH as
``sitecustomize.py``. In the coordinator, its worker processes and the load generators
it times every garbage collection (gc.callbacks: generation, wall ms, objects
collected) and notes every 5 ms sleep that overran by more than 20 ms, into
GCPROBE_DIR/<kind>-<pid>.tsv; with GCPROBE_CENSUS_S it also writes, that many seconds
after the coordinator starts, a census of the objects it tracks and the time of two
full collections by hand. Summarized by summarize_gc.py."""

import gc
import os
import sys
import threading
import time

argv = " ".join(getattr(sys, "orig_argv", []))
if "hetero.coordinator.cli" in argv or "multiprocessing" in argv or "loadgen" in argv:
    OUT = os.environ.get("GCPROBE_DIR", "/tmp/gcprobe/out")
    os.makedirs(OUT, exist_ok=True)
    kind = "coord" if "coordinator.cli" in argv else ("gen" if "loadgen" in argv else "child")
    path = f"{OUT}/{kind}-{os.getpid()}.tsv"
    rows = []
    t0 = [0.0]

    def cb(phase, info):
        if phase == "start":
            t0[0] = time.perf_counter()
        else:
            d = time.perf_counter() - t0[0]
            rows.append(
                (
                    "gc",
                    time.time(),
                    info["generation"],
                    round(d * 1000, 3),
                    info.get("collected", 0),
                )
            )

    gc.callbacks.append(cb)

    def lag():
        while True:
            a = time.perf_counter()
            time.sleep(0.005)
            d = time.perf_counter() - a - 0.005
            if d > 0.02:
                rows.append(("lag", time.time(), 0, round(d * 1000, 3), 0))

    def dump():
        while True:
            time.sleep(1.0)
            out = rows[:]
            del rows[: len(out)]
            with open(path, "a") as fh:
                for r in out:
                    fh.write("\t".join(map(str, r)) + "\n")

    def census():
        import collections

        time.sleep(float(os.environ.get("GCPROBE_CENSUS_S", "99999")))
        objs = gc.get_objects()
        c = collections.Counter(
            f"{getattr(type(o), '__module__', '?')}.{type(o).__qualname__}" for o in objs
        )
        with open(f"{OUT}/census-{kind}-{os.getpid()}.txt", "w") as fh:
            fh.write(
                f"{len(objs)} objects; gc counts {gc.get_count()} thresholds {gc.get_threshold()} frozen {gc.get_freeze_count()}\n"
            )
            for k, v in c.most_common(40):
                fh.write(f"{v}\t{k}\n")
            big = []
            for o in objs:
                try:
                    if isinstance(o, (list, dict, set, tuple, frozenset)) and len(o) > 2000:
                        big.append((len(o), type(o).__name__, repr(list(o)[:3])[:200]))
                except Exception:
                    pass
            big.sort(reverse=True)
            for b in big[:30]:
                fh.write(f"BIG {b}\n")
            a = time.perf_counter()
            gc.collect(2)
            fh.write(f"manual gen2 {1000 * (time.perf_counter() - a):.1f} ms\n")
            a = time.perf_counter()
            gc.collect(2)
            fh.write(f"manual gen2 again {1000 * (time.perf_counter() - a):.1f} ms\n")
        del objs

    if kind == "coord":
        threading.Thread(target=census, daemon=True, name="probe-census").start()
    threading.Thread(target=lag, daemon=True, name="probe-lag").start()
    threading.Thread(target=dump, daemon=True, name="probe-dump").start()
