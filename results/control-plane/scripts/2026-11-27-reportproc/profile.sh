# One load run of a checkout's import tree with py-spy sampling the coordinator's
# interpreter-lock holder (--gil) for 30 s of the measured window.
# TREE is an import tree (a folder holding hetero/, as ab.sh's); OUT gets the printed
# summary, the load average before and after, and the raw stacks (NAME.gil.txt).
# Needs py-spy in the checkout's .venv (.venv/bin/pip install py-spy; 0.4.3 here).
# Usage: bash profile.sh TREE OUT NAME   (from a checkout with its .venv)
set -u
TREE=${1:?usage: profile.sh TREE OUT NAME}
OUT=${2:?usage: profile.sh TREE OUT NAME}
NAME=${3:?usage: profile.sh TREE OUT NAME}
PY=$(pwd)/.venv/bin/python
SPY=$(pwd)/.venv/bin/py-spy
mkdir -p "$OUT"
RUN=/tmp/hetero-profile-$NAME
rm -rf "$RUN"
{ date -u; cat /proc/loadavg; } > "$OUT/$NAME.uptime"
(cd /tmp && PYTHONPATH=$TREE timeout 600 "$PY" -m hetero.bench.cli load --agents 1000 \
  --ranks 256 --queued 10000 --duration 40 --out "$RUN" > "$OUT/$NAME.txt" 2>&1) &
while [ ! -f "$RUN/go.json" ]; do sleep 1; done
sleep 5
CPID=$(pgrep -f "hetero.coordinator.cli serve" | head -1)
"$SPY" record --gil --nonblocking -r 50 -d 30 -f raw -o "$OUT/$NAME.gil.txt" -p "$CPID"
wait
{ date -u; cat /proc/loadavg; } >> "$OUT/$NAME.uptime"
