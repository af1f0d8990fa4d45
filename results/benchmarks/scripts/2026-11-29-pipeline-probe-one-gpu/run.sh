#!/usr/bin/env bash
# The sustained speed probe (trainer/pipeline/profile.py) checked on a host with one
# NVIDIA H200: GPT-2 large as one stage, idle and then with the GPU shared with a
# matmul-heavy neighbour; the predicted seconds a microbatch against the measured ones.
# One stage has no split to size: this checks the probe's prediction, not the 2-stage
# targets (results/benchmarks/scripts/2026-11-28-pipeline-probe/run.sh).
#   results/benchmarks/scripts/2026-11-29-pipeline-probe-one-gpu/run.sh OUT
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
python3 -m hetero.bench.pipeline --device cuda --model gpt2-large --stages 1 \
    --out "$out/idle" 2>&1 | tail -10
# Shared, the GPU runs at about 0.4 of its idle speed: fewer steps keep it near 2.5 min.
python3 -m hetero.bench.pipeline --device cuda --model gpt2-large --stages 1 \
    --neighbour-gpu 0 --steps 4 --warmup 1 --out "$out/shared" 2>&1 | tail -10
