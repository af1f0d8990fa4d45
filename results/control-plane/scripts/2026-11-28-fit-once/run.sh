#!/bin/bash
# The 2-core box, the coordinator and the load generators on the same two cores, nothing
# else running: the load of 1,000 hetero-agents and 256 ranks of the trainer (heartbeats
# at the coordinator's 2 s, rank 0 reports, times varying by up to 3%). Each NAME is one
# run; before-* names run the tree at BEFORE (the commit before the change, with this
# commit's bench/ so that both get the same reports), the others the tree at ROOT;
# *scrapers* names add 200 /metrics scrapers. Usage: run.sh OUT ROOT BEFORE NAME...
set -u
OUT=$(realpath -m $1); ROOT=$2; BEFORE=$3; shift 3; PY=${PY:-python3}
mkdir -p $OUT
for name in "$@"; do
  sleep 15; rm -rf /tmp/hetero-$name
  root=$ROOT; case $name in before-*) root=$BEFORE;; esac
  extra="--poll-every 10"; case $name in *scrapers*) extra="--scrapers 200";; esac
  { date -u; cat /proc/loadavg; } > $OUT/$name.uptime
  (cd /tmp && PYTHONPATH=$root timeout 600 $PY -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 --duration 60 $extra --out /tmp/hetero-$name) > $OUT/$name.txt 2>&1
  echo "$name exit $?" >> $OUT/status.txt; { date -u; cat /proc/loadavg; } >> $OUT/$name.uptime
  cp /tmp/hetero-$name/load.json $OUT/$name.json
done
