# Issue 17's load targets on a 2-core box: three consecutive runs with 10,000 queued
# jobs, every agent also polling every 10 s (--poll-every: hetero-agent polls only when
# told, and this steady load tells none), then one with 200 /metrics clients (half of
# them half-open) in every other 10 s phase. Run from a checkout with its .venv:
# bash results/control-plane/scripts/<this folder>/run.sh OUT. Each run's load.json
# (per-method p50/p99 as the clients saw them and as the coordinator measured them,
# histograms, errors, the scrapers' split), its printed summary and the load average
# before and after it go to OUT.
set -u
OUT=${1:?usage: run.sh OUT}
mkdir -p "$OUT"
BENCH=".venv/bin/hetero-bench load --agents 1000 --ranks 256 --queued 10000 --duration 60"
for run in run1 run2 run3 scrapers; do
  extra="--poll-every 10"
  [ "$run" = scrapers ] && extra="--scrapers 200"
  sleep 20
  { date -u; cat /proc/loadavg; } > "$OUT/$run.uptime"
  $BENCH $extra --out "/tmp/hetero-load-$run" > "$OUT/$run.txt" 2>&1
  echo "$run exit $?" >> "$OUT/status.txt"
  { date -u; cat /proc/loadavg; } >> "$OUT/$run.uptime"
  cp "/tmp/hetero-load-$run/load.json" "$OUT/$run.json"
  rm -rf "/tmp/hetero-load-$run"
done
