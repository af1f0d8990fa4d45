#!/bin/bash
# Interleaved, three rounds, from the repository root of a checkout of the branch:
# main's coordinator/ (before), the branch with the heartbeat worker, the branch with
# the flush on the coordinator's thread. Restores coordinator/ at the end; leaves
# behind any file main has and the branch has not (remove it by hand).
set -u
here=$(dirname "$0")
for round in 1 2 3; do
  echo "== round $round, $(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg)"
  git checkout -q main -- coordinator/
  echo "-- before (main $(git rev-parse --short main))"
  .venv/bin/python "$here/flushcpu.py"
  git checkout -q HEAD -- coordinator/
  echo "-- after, worker ($(git rev-parse --short HEAD))"
  .venv/bin/python "$here/flushcpu.py" worker
  echo "-- after, no worker"
  .venv/bin/python "$here/flushcpu.py"
done
git checkout -q HEAD -- coordinator/
