"""A stack sampler for ``hetero-coord serve`` under ``hetero-bench load``: put this file's
folder on PYTHONPATH as ``sitecustomize.py`` and every coordinator process samples the
stacks of all its threads every 20 ms inside the run's measured window (read from
``HETERO_PROF_GO``, the run's ``go.json``), and writes the counts to ``HETERO_PROF_OUT``
at exit: one line per (thread name, stack), the first line the number of samples."""

import atexit
import collections
import json
import os
import sys
import threading
import time

if "hetero.coordinator.cli" in " ".join(getattr(sys, "orig_argv", [])):
    OUT = os.environ.get("HETERO_PROF_OUT", "stacks.txt")
    GO = os.environ.get("HETERO_PROF_GO", "go.json")
    counts: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter()
    ticks = [0]

    def sample() -> None:
        me = threading.get_ident()
        window = None
        while True:
            time.sleep(0.02)
            if window is None:
                try:
                    with open(GO) as fh:
                        go = json.load(fh)
                    window = (go["start_unix_s"], go["end_unix_s"])
                except (OSError, ValueError, KeyError):
                    continue
            if not window[0] <= time.time() <= window[1]:
                continue
            ticks[0] += 1
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                stack = []
                f = frame
                while f is not None and len(stack) < 40:
                    co = f.f_code
                    stack.append(f"{os.path.basename(co.co_filename)}:{co.co_name}:{f.f_lineno}")
                    f = f.f_back
                name = names.get(tid, "?").rstrip("0123456789").rstrip("_")
                counts[(name, tuple(reversed(stack)))] += 1

    def dump() -> None:
        with open(OUT, "w") as fh:
            fh.write(f"{ticks[0]}\tTICKS\t\n")
            for (name, stack), n in counts.most_common():
                fh.write(f"{n}\t{name}\t{';'.join(stack)}\n")

    threading.Thread(target=sample, daemon=True, name="prof-sampler").start()
    atexit.register(dump)
