# Issue 17's load targets after the full-collection, report-worker and /metrics-process
# changes, on a 2-core box with nothing else running. First an A/B of BEFORE's and
# AFTER's coordinators (import trees, as `make pyroot` builds build/pyroot), alternated
# 20 s apart, ROUNDS each, 10,000 queued, 40 s measured; then AFTER alone: three
# consecutive 60 s runs with every agent also polling every 10 s, and one with 200
# /metrics clients (half half-open) in every other 10 s phase, at the scrapers' default
# niceness (19) and once at 0. Run from a checkout with its .venv:
# bash run.sh BEFORE_TREE AFTER_TREE OUT [ROUNDS]
set -u
BEFORE=${1:?usage: run.sh BEFORE_TREE AFTER_TREE OUT [ROUNDS]}
AFTER=${2:?usage: run.sh BEFORE_TREE AFTER_TREE OUT [ROUNDS]}
OUT=${3:?usage: run.sh BEFORE_TREE AFTER_TREE OUT [ROUNDS]}
ROUNDS=${4:-3}
PY=$(pwd)/.venv/bin/python
mkdir -p "$OUT"
one() {  # one run: NAME TREE ARGS...
  local name=$1 tree=$2
  shift 2
  sleep 20
  rm -rf "/tmp/hetero-$name"
  { date -u; cat /proc/loadavg; } > "$OUT/$name.uptime"
  (cd /tmp && PYTHONPATH=$tree timeout 600 "$PY" -m hetero.bench.cli load --agents 1000 \
    --ranks 256 --queued 10000 "$@" --out "/tmp/hetero-$name") > "$OUT/$name.txt" 2>&1
  echo "$name exit $?" >> "$OUT/status.txt"
  { date -u; cat /proc/loadavg; } >> "$OUT/$name.uptime"
  cp "/tmp/hetero-$name/load.json" "$OUT/$name.json"
}
for i in $(seq "$ROUNDS"); do
  one "ab-before-$i" "$BEFORE" --duration 40
  one "ab-after-$i" "$AFTER" --duration 40
done
for run in run1 run2 run3; do
  one "$run" "$AFTER" --duration 60 --poll-every 10
done
one scrapers "$AFTER" --duration 60 --scrapers 200
one scrapers-nice0 "$AFTER" --duration 60 --scrapers 200 --scrapers-nice 0
