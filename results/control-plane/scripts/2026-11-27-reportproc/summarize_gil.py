"""Shares of the interpreter lock by what held it, from py-spy's raw output of
``profile.sh`` (``record --gil -f raw``: one line per stack, "frame;frame;... COUNT").
Usage: python summarize_gil.py NAME.gil.txt"""

import collections
import sys

#: What a stack is counted as: the first of these its frames name, outermost first;
#: a stack of the event loop's thread with none of them is "run_forever" (gRPC's
#: Cython call machinery and asyncio).
KEYS = {
    "ReportIntervalStats": "ReportIntervalStats",
    "GetPlan": "GetPlan",
    "HeartbeatIngest.flush": "heartbeat flush",
    "NodeHandlers.Heartbeat": "Heartbeat",
    "PollAssignments": "PollAssignments",
    "sweep_once": "sweeper",
    "intercept_service": "guard and call",
    "_feed": "process-pool feeder",
}


def kind(frames: list[str]) -> str:
    for f in frames:
        for key, label in KEYS.items():
            if key in f:
                return label
    return "run_forever" if any("run_forever" in f for f in frames) else "?"


def main(path: str) -> None:
    total = 0
    counts: collections.Counter[str] = collections.Counter()
    with open(path) as fh:
        for line in fh:
            stack, n = line.rstrip().rsplit(" ", 1)
            total += int(n)
            counts[kind(stack.split(";"))] += int(n)
    print(f"{total} samples with the lock held")
    for key, n in counts.most_common():
        print(f"  {n / total:6.1%} {key}")


if __name__ == "__main__":
    main(sys.argv[1])
