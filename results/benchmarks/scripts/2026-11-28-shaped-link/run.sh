#!/usr/bin/env bash
# Two "nodes" on one host with 2x NVIDIA H200: network namespaces a (GPU 0) and b (GPU 1)
# whose only link is one veth pair, shaped with tc (tbf) to RATE; NCCL over that socket
# link alone (no NVLink, no shared memory: NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1). GPU 1
# is shared with a matmul-heavy neighbour. For each rate, the model-zoo loop in plain DDP
# (train_ddp.py, equal batches) and through hetero (train.py, dynamic), alternated.
#   results/benchmarks/scripts/2026-11-28-shaped-link/run.sh OUT MODEL STEPS RATE...
# RATE: "none" (unshaped veth) or a tc rate such as 10gbit. Needs root (ip netns, tc);
# iproute2's Debian packages in .iproute/ are unpacked where the host has no `ip`.
set -uo pipefail
out=$1 model=$2 steps=$3; shift 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=veth
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
if [ -d .iproute ]; then  # iproute2 from Debian's packages where the image has none
    mkdir -p /tmp/ipr && for f in .iproute/*.deb; do dpkg -x "$f" /tmp/ipr; done
    export PATH=/tmp/ipr/usr/sbin:/tmp/ipr/sbin:/tmp/ipr/bin:$PATH
    export LD_LIBRARY_PATH=/tmp/ipr/usr/lib/x86_64-linux-gnu:/tmp/ipr/lib/x86_64-linux-gnu
fi
mkdir -p "$out"
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
ip netns del a 2>/dev/null; ip netns del b 2>/dev/null
ip netns add a && ip netns add b || { echo "no network namespaces here"; exit 3; }
ip link add veth-a type veth peer name veth-b || exit 3
ip link set veth-a netns a && ip link set veth-b netns b
ip -n a addr add 10.77.0.1/24 dev veth-a && ip -n b addr add 10.77.0.2/24 dev veth-b
for n in a b; do ip -n $n link set lo up; ip -n $n link set veth-$n up; done

shape() {  # rate|none: both ends
    for n in a b; do
        ip netns exec $n tc qdisc del dev veth-$n root 2>/dev/null
        [ "$1" = none ] || ip netns exec $n tc qdisc add dev veth-$n root tbf rate "$1" burst 4mb latency 50ms
    done
}

python3 -m hetero.bench.harness.neighbour --device cuda:1 > "$out/neighbour.log" 2>&1 &
neighbour=$!
sleep 5

common=(--model "$model" --data device --global-batch 512 --steps "$steps"
        --rebalance-interval 10 --ideal-steps 0 --amp bf16 --device cuda)
one() {  # rate, label, script, extra args...
    local rate=$1 label=$2 script=$3; shift 3
    local dir="$out/$rate/$label" port=$((29600 + RANDOM % 300))
    mkdir -p "$dir"
    local pids=()
    for r in 0 1; do
        local ns=$([ $r = 0 ] && echo a || echo b)
        CUDA_VISIBLE_DEVICES=$r ip netns exec $ns python3 -m torch.distributed.run \
            --nnodes 2 --node_rank $r --nproc_per_node 1 \
            --master_addr 10.77.0.1 --master_port $port \
            -m "hetero.bench.zoo.$script" "${common[@]}" "$@" \
            --output-dir "$dir" --summary-json "$dir/summary.json" > "$dir/node$r.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    python3 - "$dir/summary.json" "$rate" "$label" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except OSError:
    print(sys.argv[2], sys.argv[3], "no summary"); sys.exit()
wanted = ("samples_per_s", "batch", "plan", "steady", "comm")
print(sys.argv[2], sys.argv[3], {k: v for k, v in s.items() if any(w in k for w in wanted)})
PY
}
for rate in "$@"; do
    shape "$rate"
    one "$rate" ddp train_ddp
    one "$rate" hetero train --policy dynamic
    one "$rate" ddp-again train_ddp
    one "$rate" hetero-again train --policy dynamic
done
kill $neighbour; wait $neighbour 2>/dev/null
ip netns del a; ip netns del b
tar czf "$out.tar.gz" -C "$out" .
