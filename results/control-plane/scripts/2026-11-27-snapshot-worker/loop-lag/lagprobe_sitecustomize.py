# ruff: noqa: SIM115, B905  (a measuring probe, kept as it ran)
"""Event-loop lag probe for the coordinator: a 10 ms tick on every event loop that runs
(the gRPC loop), and a watchdog thread that, when the loop has not ticked for 40 ms,
records the loop thread's stack, the process's CPU over the gap and the box's busy
share; plus every tick's lateness per second."""

import asyncio
import json
import os
import sys
import threading
import time
import traceback

if (
    "hetero.coordinator.cli" in sys.orig_argv or "hetero.bench.loadgen" in sys.orig_argv
) and os.environ.get("LAGPROBE_DIR"):
    out = open(
        os.path.join(os.environ["LAGPROBE_DIR"], f"lag-{os.getpid()}.jsonl"), "a", buffering=1
    )
    state = {"last": None, "tid": None}
    per_sec = {}

    def stat():
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]

    orig = asyncio.BaseEventLoop.run_forever

    def run_forever(self):
        state["tid"] = threading.get_ident()

        def tick(expected):
            now = time.monotonic()
            state["last"] = now
            late = now - expected
            sec = int(time.time())
            m = per_sec.setdefault(sec, [0, 0.0])
            m[0] += 1
            m[1] = max(m[1], late)
            self.call_later(0.01, tick, now + 0.01)

        self.call_soon(tick, time.monotonic())
        return orig(self)

    asyncio.BaseEventLoop.run_forever = run_forever

    def watchdog():
        reported = None
        s0 = stat()
        c0 = time.process_time()
        t0 = time.monotonic()
        while True:
            time.sleep(0.005)
            last = state["last"]
            if last is None:
                continue
            now = time.monotonic()
            if now - last > 0.04 and reported != last:
                reported = last
                f = sys._current_frames().get(state["tid"])
                st = (
                    [
                        f"{x.filename.rsplit('/', 2)[-1]}:{x.lineno}:{x.name}"
                        for x in traceback.extract_stack(f)[-6:]
                    ]
                    if f
                    else []
                )
                others = {}
                for th in threading.enumerate():
                    ff = sys._current_frames().get(th.ident)
                    if ff is not None and th.ident not in (state["tid"], threading.get_ident()):
                        x = traceback.extract_stack(ff)[-1]
                        if not any(
                            w in x.name
                            for w in (
                                "wait",
                                "_worker",
                                "select",
                                "sleep",
                                "accept",
                                "_recv",
                                "poll",
                                "run",
                            )
                        ):
                            others[th.name] = f"{x.filename.rsplit('/', 2)[-1]}:{x.lineno}:{x.name}"
                out.write(
                    json.dumps(
                        {
                            "t": time.time(),
                            "stalled_ms": (now - last) * 1e3,
                            "loop": st,
                            "others": others,
                        }
                    )
                    + "\n"
                )
            if now - t0 > 1.0:
                s1 = stat()
                c1 = time.process_time()
                d = [b - a for a, b in zip(s0, s1)]
                sec = int(time.time()) - 1
                m = per_sec.pop(sec, None)
                out.write(
                    json.dumps(
                        {
                            "sec": sec,
                            "proc_cores": (c1 - c0) / (now - t0),
                            "box_busy": 1 - (d[3] + d[4]) / (sum(d) or 1),
                            "ticks": m,
                        }
                    )
                    + "\n"
                )
                s0, c0, t0 = s1, c1, now

    threading.Thread(target=watchdog, name="lagprobe", daemon=True).start()
