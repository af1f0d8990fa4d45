"""Summarize a sampler file (``sampler_sitecustomize.py``): per thread kind and what it
does, the average number of threads waiting for the coordinator's write lock, running, or
idle. Usage: python summarize_stacks.py stacks.txt"""

import collections
import sys

IDLE = ("thread.py:_worker:81", "threading.py:wait", "selectors.py:select", "threading.py:run:")
ENTRIES = ("plan_rpcs.py", "node_rpcs.py", "job_rpcs.py", "telemetry.py", "queue.py", "recovery.py")


def entry(frames: list[str]) -> str:
    for f in frames:
        if f.startswith(ENTRIES):
            return f.rsplit(":", 1)[0]
    return "?"


def main(path: str) -> None:
    with open(path) as fh:
        lines = fh.read().splitlines()
    ticks = int(lines[0].split("\t")[0])
    waiting: collections.Counter[tuple[str, str]] = collections.Counter()
    other: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in lines[1:]:
        n, thread, stack = line.split("\t")
        frames = stack.split(";")
        if frames[-1].startswith(IDLE):
            other[(thread, "idle")] += int(n)
        elif frames[-1].startswith("database.py:_on_begin"):
            waiting[(thread, entry(frames))] += int(n)
        else:
            other[(thread, entry(frames))] += int(n)
    print(f"{ticks} samples")
    print("waiting for the write lock (threads on average):")
    for key, n in waiting.most_common(8):
        print(f"  {n / ticks:6.2f} {key}")
    print("running or idle (threads on average):")
    for key, n in other.most_common(16):
        print(f"  {n / ticks:6.2f} {key}")


if __name__ == "__main__":
    main(sys.argv[1])
