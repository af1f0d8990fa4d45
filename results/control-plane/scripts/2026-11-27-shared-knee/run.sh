#!/bin/bash
# The 2-core box, coordinator and load generators on the same two cores: 1,000 agents
# heartbeating every 1 s against every 1.33 s (750 a second), alternated.
# Usage: run.sh OUT PYROOT (PYROOT: a build/pyroot of the commit under test)
set -u
OUT=$(realpath -m $1); ROOT=$2; PY=${PY:-python3}
mkdir -p $OUT
one() { local name=$1; shift; sleep 15; rm -rf /tmp/hetero-$name
  { date -u; cat /proc/loadavg; } > $OUT/$name.uptime
  (cd /tmp && PYTHONPATH=$ROOT timeout 600 $PY -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 --duration 40 "$@" --out /tmp/hetero-$name) > $OUT/$name.txt 2>&1
  echo "$name exit $?" >> $OUT/status.txt; { date -u; cat /proc/loadavg; } >> $OUT/$name.uptime
  cp /tmp/hetero-$name/load.json $OUT/$name.json; }
for i in 1 2; do
  one hb1.00-$i --heartbeat-s 1.0
  one hb1.33-$i --heartbeat-s 1.33
done
