# Two commits' coordinators alternated under the same load, 10,000 queued, ROUNDS runs each
# (default 2).
# BEFORE and AFTER are import trees of the two checkouts (a folder holding hetero/ with
# the packages linked in, as `make typecheck` builds build/typecheck); OUT gets each
# run's load.json, its printed summary and the load average before and after.
# Usage: bash ab.sh BEFORE_TREE AFTER_TREE OUT [ROUNDS]   (from a checkout with its .venv)
set -u
BEFORE=${1:?usage: ab.sh BEFORE_TREE AFTER_TREE OUT}
AFTER=${2:?usage: ab.sh BEFORE_TREE AFTER_TREE OUT}
OUT=${3:?usage: ab.sh BEFORE_TREE AFTER_TREE OUT}
ROUNDS=${4:-2}
PY=$(pwd)/.venv/bin/python
mkdir -p "$OUT"
for i in $(seq "$ROUNDS"); do
  for v in before after; do
    sleep 20
    tree=$BEFORE
    [ "$v" = after ] && tree=$AFTER
    rm -rf "/tmp/hetero-ab-$v-$i"
    { date -u; cat /proc/loadavg; } > "$OUT/ab-$v-$i.uptime"
    (cd /tmp && PYTHONPATH=$tree timeout 600 "$PY" -m hetero.bench.cli load --agents 1000 \
      --ranks 256 --queued 10000 --duration 40 --out "/tmp/hetero-ab-$v-$i") \
      > "$OUT/ab-$v-$i.txt" 2>&1
    { date -u; cat /proc/loadavg; } >> "$OUT/ab-$v-$i.uptime"
    cp "/tmp/hetero-ab-$v-$i/load.json" "$OUT/ab-$v-$i.json"
  done
done
