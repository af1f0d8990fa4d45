# ruff: noqa: SIM115, B905  (a measuring probe, kept as it ran)
"""Stall probe for the coordinator: a thread that sleeps 2 ms and records wakes later
than 30 ms (with the process's CPU time over the gap, the box's /proc/stat and the
other threads' stacks), and the start/end of every cluster snapshot build."""

import json
import os
import sys
import threading
import time
import traceback

if "hetero.coordinator.cli" in sys.orig_argv and os.environ.get("STALLPROBE_DIR"):
    out = open(
        os.path.join(os.environ["STALLPROBE_DIR"], f"stall-{os.getpid()}.jsonl"), "a", buffering=1
    )

    def cpu_stat():
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
        return [int(x) for x in parts]

    def watch():
        while True:
            t0 = time.monotonic()
            c0 = time.process_time()
            s0 = cpu_stat()
            time.sleep(0.002)
            t1 = time.monotonic()
            gap = t1 - t0
            if gap > 0.03:
                c1 = time.process_time()
                s1 = cpu_stat()
                d = [b - a for a, b in zip(s0, s1)]
                total = sum(d) or 1
                frames = sys._current_frames()
                stacks = {}
                for th in threading.enumerate():
                    f = frames.get(th.ident)
                    if f is not None and th is not threading.current_thread():
                        st = traceback.extract_stack(f)[-4:]
                        stacks[th.name] = [
                            f"{x.filename.rsplit('/', 2)[-1]}:{x.lineno}:{x.name}" for x in st
                        ]
                out.write(
                    json.dumps(
                        {
                            "t": time.time(),
                            "gap": gap,
                            "proc_cpu": c1 - c0,
                            "box_busy": 1 - (d[3] + d[4]) / total,
                            "stacks": stacks,
                        }
                    )
                    + "\n"
                )

    threading.Thread(target=watch, name="stallprobe", daemon=True).start()

    def patch():
        # wait for the module to be importable, then wrap snapshot builds
        while True:
            m = sys.modules.get("hetero.coordinator.rpc")
            if m is not None and hasattr(m, "Handlers"):
                break
            time.sleep(0.05)
        H = m.Handlers
        orig = H.snapshot

        def snapshot(self):
            a = time.time()
            c = time.thread_time()
            try:
                return orig(self)
            finally:
                out.write(
                    json.dumps(
                        {
                            "build_start": a,
                            "build_s": time.time() - a,
                            "build_cpu": time.thread_time() - c,
                        }
                    )
                    + "\n"
                )

        H.snapshot = snapshot
        ms = None
        while ms is None:
            ms = sys.modules.get("hetero.coordinator.metrics")
            time.sleep(0.05)
        of = ms.families

        def families(snap):
            a = time.time()
            c = time.thread_time()
            try:
                return of(snap)
            finally:
                out.write(
                    json.dumps(
                        {
                            "families_start": a,
                            "families_s": time.time() - a,
                            "families_cpu": time.thread_time() - c,
                        }
                    )
                    + "\n"
                )

        ms.families = families
        mss = None
        while mss is None:
            mss = sys.modules.get("hetero.coordinator.metricsserver")
            time.sleep(0.05)
        mss.families = families

    threading.Thread(target=patch, name="stallprobe-patch", daemon=True).start()
