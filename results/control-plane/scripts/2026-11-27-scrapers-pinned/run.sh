#!/bin/bash
# hetero-bench load with 200 /metrics scrapers, the coordinator pinned to CPUs 0-1 and the
# load generators and scrapers on the others. Usage: run.sh OUT NAME...
# Run from the repository root of a host with the offline wheelhouse. EXTRA= (empty)
# runs without scrapers.
set -u
OUT=$1; shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --root-user-action=ignore --no-index --find-links wheelhouse/py3.12 \
  sqlalchemy alembic pyyaml prometheus-client psutil grpcio-health-checking grpcio-reflection >/dev/null 2>&1
make pyroot >/dev/null
# NAME before-*: the tree of an earlier commit unpacked in build/before (git archive).
[ -d build/before ] && make -C build/before pyroot >/dev/null
OUT=$(realpath -m $OUT); mkdir -p $OUT
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)"; python3 --version; python3 -c "import grpc, sqlalchemy; print('grpcio', grpc.__version__, 'sqlalchemy', sqlalchemy.__version__)"; git rev-parse HEAD 2>/dev/null; } > $OUT/host.txt
for name in "$@"; do
  sleep 5
  { date -u; cat /proc/loadavg; } > $OUT/$name.uptime
  root=$PWD/build/pyroot; case $name in before-*) root=$PWD/build/before/build/pyroot;; esac
  (cd /tmp && PYTHONPATH=$root timeout 290 python3 -m hetero.bench.cli load --agents 1000 --ranks 256 --queued 10000 \
    --duration 60 --poll-every 10 ${EXTRA---scrapers 200} --coordinator-cpus 0-1 --out /tmp/$name) > $OUT/$name.txt 2>&1
  echo "$name exit $?" >> $OUT/status.txt
  { date -u; cat /proc/loadavg; } >> $OUT/$name.uptime
  cp /tmp/$name/load.json $OUT/$name.json 2>/dev/null
done
