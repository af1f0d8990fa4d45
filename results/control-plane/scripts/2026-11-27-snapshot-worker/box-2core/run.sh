# BEFORE and AFTER checkouts' import trees under /tmp/before and /tmp/after (make pyroot);
# run from a checkout with its .venv. Usage: bash run.sh OUT
set -u
OUT=$1
PY=$(pwd)/.venv/bin/python
mkdir -p $OUT
one() { local name=$1 tree=$2; shift 2; sleep 15; rm -rf /tmp/hetero-$name
  { date -u; cat /proc/loadavg; } > $OUT/$name.uptime
  (cd /tmp && PYTHONPATH=$tree timeout 600 $PY -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 "$@" --out /tmp/hetero-$name) > $OUT/$name.txt 2>&1
  echo "$name exit $?" >> $OUT/status.txt; { date -u; cat /proc/loadavg; } >> $OUT/$name.uptime; cp /tmp/hetero-$name/load.json $OUT/$name.json; }
for i in 1 2; do
one ab-before-$i /tmp/before/build/pyroot --duration 40
one ab-after-$i /tmp/after/build/pyroot --duration 40
done
for i in 1 2; do
one scrapers-before-$i /tmp/before/build/pyroot --duration 60 --scrapers 200
one scrapers-after-$i /tmp/after/build/pyroot --duration 60 --scrapers 200
done
for run in run1 run2 run3; do
one $run /tmp/after/build/pyroot --duration 60 --poll-every 10
done
