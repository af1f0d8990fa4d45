"""Summarize the gc probe's files (gcprobe_sitecustomize.py) of one load run inside its
measured window: per process, collections by generation (count, total ms, max ms), and
the full collections with their time in the window.
Usage: python summarize_gc.py PROBE_DIR RUN_DIR (RUN_DIR holds the run's go.json)."""

import collections
import glob
import json
import os
import sys

probe, run = sys.argv[1], sys.argv[2]
with open(os.path.join(run, "go.json")) as fh:
    go = json.load(fh)
s0, s1 = go["start_unix_s"], go["end_unix_s"]
for path in sorted(glob.glob(os.path.join(probe, "*.tsv"))):
    with open(path) as fh:
        rows = [line.rstrip("\n").split("\t") for line in fh]
    rows = [(k, float(t) - s0, int(g), float(d)) for k, t, g, d, _ in rows if s0 <= float(t) <= s1]
    by_gen = collections.defaultdict(list)
    for kind, _, gen, ms in rows:
        if kind == "gc":
            by_gen[gen].append(ms)
    summary = {g: (len(v), round(sum(v), 1), max(v)) for g, v in sorted(by_gen.items())}
    full = [(round(t, 1), ms) for kind, t, gen, ms in rows if kind == "gc" and gen == 2]
    print(os.path.basename(path), "gen: (count, total ms, max ms)", summary)
    print("   full collections (s into the window, ms):", full)
