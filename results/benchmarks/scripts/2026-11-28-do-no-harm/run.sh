#!/usr/bin/env bash
# The do-no-harm runs of 2026-11-28 on a host with 2x NVIDIA H200 (32 cores), Python
# 3.12 and torch 2.11 of the host's image; hetero from this checkout on PYTHONPATH, the
# few pure-Python packages the image lacks from wheels carried in .whl/.
#   results/benchmarks/scripts/2026-11-28-do-no-harm/run.sh OUT smoke|jpeg|rest|vit|again
set -euo pipefail
out=$1 part=$2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
run() {  # scenario, then hetero-bench run's options
    local s=$1; shift
    python3 -m hetero.bench.cli run "$s" "$@" --out "$out/bench/$s" > "$out/$s.log" 2>&1 \
        || echo "$s: exit $?" >> "$out/failed.txt"
    tail -n 25 "$out/$s.log"
}
mkdir -p "$out"
python3 -c "import torch, timm, yaml, PIL, grpc, grpc_health, psutil; print(torch.__version__, torch.cuda.device_count(), timm.__version__)"
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m hetero.bench.cli run zoo-jpeg-resnet50 --dry-run --out /tmp/dry > /dev/null
case $part in
smoke)
    run zoo-neighbour-arrives --quick --steps 40 --ideal-steps 0 --policies dynamic --no-baseline
    ;;
jpeg)
    run zoo-jpeg-resnet50 --steps 200 --ideal-steps 2
    run zoo-alike-jitter --quick
    ;;
rest)
    run zoo-neighbour-arrives --quick
    run zoo-jpeg-resnet50-small --steps 200 --ideal-steps 2
    ;;
again)
    # After the first batch size's cost became the first move's price (see the log).
    run zoo-neighbour-arrives --quick
    run zoo-jpeg-resnet50-small --quick
    ;;
vit)
    python3 results/benchmarks/scripts/2026-11-28-do-no-harm/shapes.py convnext_tiny > "$out/shapes.log" 2>&1 || true
    python3 results/benchmarks/scripts/2026-11-28-do-no-harm/shapes.py resnet50 >> "$out/shapes.log" 2>&1 || true
    cat "$out/shapes.log"
    run zoo-vit --quick --policies dynamic
    ;;
esac
tar czf "$out/$part.tar.gz" -C "$out" bench $(cd "$out" && ls *.log 2>/dev/null)
