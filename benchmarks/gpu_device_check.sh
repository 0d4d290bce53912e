#!/usr/bin/env bash
# The GPU checks of issue 34 item 4, as one command for a lent GPU machine (the device tool's `run`):
#
#     bash benchmarks/gpu_device_check.sh        # about 6-8 minutes on an H200; writes under $OUT
#
# It uses that machine's own python3 (a CUDA torch, triton, gpytorch, numba, pandas, hypothesis are
# in its image; nothing can be installed there) with this checkout on PYTHONPATH. Steps: (1) the Triton
# round's tests and the GPU engine tests, compiled for the device (not the interpreter); (2) the
# round alone at K = 10^4, 10^5, 10^6 clients with 4, 8 and 16 warps (benchmarks/gpu_round.py);
# (3) whole fits, Triton round vs tensor path (benchmarks/gpu_batched.py). Rows are appended to a
# copy of results/benchmarks/gpu_batched.csv in $OUT: fetch it back and commit it over the original.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" MPLBACKEND=Agg
unset TRITON_INTERPRET
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
cp results/benchmarks/gpu_batched.csv "$OUT/gpu_batched.csv"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/engines/test_triton_round.py tests/engines/test_gpu.py 2>&1 |
    tee "$OUT/pytest.log" | tail -15
timeout 240 python3 benchmarks/gpu_round.py --clients 10000 100000 1000000 --num-warps 4 8 16 \
    --out "$OUT/gpu_batched.csv" 2>&1 | tee "$OUT/gpu_round.log"
timeout 200 python3 benchmarks/gpu_batched.py --clients 10000 --rounds 10 --repeats 3 --chunk-sizes 16384 65536 \
    --out "$OUT/gpu_batched.csv" 2>&1 | tee "$OUT/gpu_batched.log" | tail -12
