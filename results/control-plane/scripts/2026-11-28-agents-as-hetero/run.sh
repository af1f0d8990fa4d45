#!/bin/bash
# The 2-core box, the coordinator and the load generators on the same two cores, nothing
# else running. The load of 1,000 hetero-agents and 256 ranks of the trainer: heartbeats
# at the coordinator's interval (2 s), rank 0 reports. Three consecutive runs, then the
# load this benchmark had before (--heartbeat-s 1 --get-plan-per-rank), then 200
# scrapers twice. Usage: run.sh OUT PYROOT
set -u
OUT=$(realpath -m $1); ROOT=$2; PY=${PY:-python3}
mkdir -p $OUT
one() { local name=$1; shift; sleep 15; rm -rf /tmp/hetero-$name
  { date -u; cat /proc/loadavg; } > $OUT/$name.uptime
  (cd /tmp && PYTHONPATH=$ROOT timeout 600 $PY -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 --duration 60 "$@" --out /tmp/hetero-$name) > $OUT/$name.txt 2>&1
  echo "$name exit $?" >> $OUT/status.txt; { date -u; cat /proc/loadavg; } >> $OUT/$name.uptime
  cp /tmp/hetero-$name/load.json $OUT/$name.json; }
for i in 1 2 3; do one run$i --poll-every 10; done
one old-load --poll-every 10 --heartbeat-s 1 --get-plan-per-rank
one scrapers1 --scrapers 200
one scrapers2 --scrapers 200
