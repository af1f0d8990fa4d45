# Control-plane measurements on a host with 2x NVIDIA H200 (32 CPU cores): the overhead
# ratio on CUDA, plan latency, and the 1,000-agent load on a quiet many-core host.
# OUT is the folder the results go to; .gpu/ holds wheels built from this tree
# (pip wheel --no-deps -w .gpu .) and their dependencies (.gpu/wheels/).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python -m pip install --no-deps -q .gpu/wheels/*.whl 2>&1 | grep -v WARN | tail -2
python -m pip install --force-reinstall --no-deps -q .gpu/hetero-*.whl 2>&1 | grep -v WARN | tail -2
cd /tmp && R=$OUT && mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee $R/gpus.txt
python -c "import torch, grpc, sqlalchemy; print('torch', torch.__version__, 'grpcio', grpc.__version__, 'sqlalchemy', sqlalchemy.__version__)" | tee -a $R/gpus.txt
nproc | tee -a $R/gpus.txt
timeout 330 python -m hetero.agent.controlbench overhead --device cuda --model resnet18 \
  --global-batch 256 --steps 600 --repeats 5 > $R/overhead_cuda.json 2> $R/overhead_cuda.err
echo "overhead exit $?" | tee -a $R/status.txt
timeout 90 python -m hetero.agent.controlbench latency -n 1000 > $R/latency.json 2> $R/latency.err
echo "latency exit $?" | tee -a $R/status.txt
timeout 150 hetero-bench load --agents 1000 --ranks 256 --duration 60 --out /tmp/load --json \
  > $R/load.json 2> $R/load.err
echo "load exit $?" | tee -a $R/status.txt
cp /tmp/load/load.json $R/load_out.json 2>/dev/null
tail -c 3000 $R/overhead_cuda.json; tail -5 $R/overhead_cuda.err; cat $R/latency.json | head -30
