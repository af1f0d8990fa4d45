# One against two report workers, alternated, on the checkout this runs from (its .venv
# and build/pyroot, make pyroot); the worker count from /etc/hetero/coordinator.yaml.
set -u
OUT=/tmp/w12
ROOT=$(pwd)
PY=$ROOT/.venv/bin/python
for i in 1 2; do
  for w in 2 1; do
    sleep 15
    if [ $w = 1 ]; then mkdir -p /etc/hetero && echo "report_processes: 1" > /etc/hetero/coordinator.yaml; else rm -f /etc/hetero/coordinator.yaml; fi
    name=w$w-$i
    rm -rf /tmp/hetero-$name
    { date -u; cat /proc/loadavg; } > $OUT/$name.uptime
    (cd /tmp && PYTHONPATH=$ROOT/build/pyroot timeout 600 $PY -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 --duration 40 --out /tmp/hetero-$name) > $OUT/$name.txt 2>&1
    { date -u; cat /proc/loadavg; } >> $OUT/$name.uptime
    cp /tmp/hetero-$name/load.json $OUT/$name.json
    pgrep -f "spawn_main" >/dev/null; 
  done
done
rm -f /etc/hetero/coordinator.yaml; rmdir /etc/hetero
echo finished >> $OUT/status
