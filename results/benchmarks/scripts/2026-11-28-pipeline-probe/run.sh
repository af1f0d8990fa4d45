#!/usr/bin/env bash
# GPT-2 large in 2 pipeline stages on a host with 2x NVIDIA H200: the even split, the
# speed-sized one and the re-cut from the even run's speeds, first with GPU 1 shared with
# a matmul-heavy neighbour, then on the two idle GPUs.
#   results/benchmarks/scripts/2026-11-28-pipeline-probe/run.sh OUT
# Written for the sustained speed probe (trainer/pipeline/profile.py); not yet run: its
# results, once run, go beside it as an archive and a row in docs/benchmarks.md.
set -uo pipefail
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
mkdir -p "$out"
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])'
date -u +%H:%M
python3 -m hetero.bench.pipeline --device cuda --model gpt2-large --stages 2 \
    --neighbour-gpu 1 --out "$out/shared" 2>&1 | tail -12
date -u +%H:%M
python3 -m hetero.bench.pipeline --device cuda --model gpt2-large --stages 2 \
    --out "$out/idle" 2>&1 | tail -12
date -u +%H:%M
