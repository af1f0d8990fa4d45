#!/bin/bash
# The 2-core box, the coordinator and the load generators on the same two cores, nothing
# else running: three consecutive runs of the default load (rank 0 reports, as the
# trainer does), then the load with every rank calling GetPlan, then 200 scrapers.
# Usage: run.sh OUT PYROOT
set -u
OUT=$(realpath -m $1); ROOT=$2; PY=${PY:-python3}
mkdir -p $OUT
one() { local name=$1; shift; sleep 15; rm -rf /tmp/hetero-$name
  { date -u; cat /proc/loadavg; } > $OUT/$name.uptime
  (cd /tmp && PYTHONPATH=$ROOT timeout 600 $PY -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 --duration 60 "$@" --out /tmp/hetero-$name) > $OUT/$name.txt 2>&1
  echo "$name exit $?" >> $OUT/status.txt; { date -u; cat /proc/loadavg; } >> $OUT/$name.uptime
  cp /tmp/hetero-$name/load.json $OUT/$name.json; }
for i in 1 2 3; do one run$i --poll-every 10; done
one per-rank-getplan --poll-every 10 --get-plan-per-rank
one scrapers1 --scrapers 200
one scrapers2 --scrapers 200
