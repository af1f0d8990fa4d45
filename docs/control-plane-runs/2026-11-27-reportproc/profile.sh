# usage: profile.sh TREE NAME  -- one load run on TREE with py-spy (--gil) on the coordinator in the window
TREE=$1; NAME=$2; D=/tmp/rp-measure
PY=/work/wt/reportproc/.venv/bin/python
rm -rf $D/out-$NAME
{ date -u; cat /proc/loadavg; } > $D/$NAME.uptime
(cd /tmp && PYTHONPATH=$TREE timeout 600 $PY -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 --duration 40 --out $D/out-$NAME > $D/$NAME.txt 2>&1) &
while [ ! -f $D/out-$NAME/go.json ]; do sleep 1; done
sleep 5
CPID=$(pgrep -f "hetero.coordinator.cli serve" | head -1)
/work/wt/reportproc/.venv/bin/py-spy record --gil --nonblocking -r 50 -d 30 -f raw -o $D/$NAME.gil.txt -p $CPID > $D/$NAME.pyspy.log 2>&1
/work/wt/reportproc/.venv/bin/py-spy record --nonblocking --idle -r 20 -d 1 -f raw -o /dev/null -p $CPID >/dev/null 2>&1
wait
{ date -u; cat /proc/loadavg; } >> $D/$NAME.uptime
