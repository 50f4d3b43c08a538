#!/bin/bash
# The wgmma attention experiment (issue 17; docs/benchmarks.md, "wgmma
# attention experiment"): builds for sm_90a the general kernels'
# check (attention_wgmma.cuh: any T, GQA, bf16/fp16, head sizes 64/128) and
# the first forward and backward prototypes, checks them against their fp32
# references and times them, beside
# PyTorch's SDPA (flash and cuDNN backends) at the same shapes when PyTorch
# is there. A benchmark, not a test; needs a Hopper GPU (H100/H200).
#
#   bash bench/wgmma_attention/run.sh [OUT_DIR]
# Exit: 0 when every check passed, 1 when one failed or would not build.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
O=${1:-/tmp/wgmma_attention}
mkdir -p "$O"
rc=0
for k in check fwd bwd; do
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I "$HERE" \
    "$HERE/attention_wgmma_$k.cu" -o "$O/attention_wgmma_$k" || { echo "build of $k failed"; exit 1; }
done
command -v cuobjdump > /dev/null &&
  cuobjdump -sass "$O/attention_wgmma_fwd" | grep -o "HGMMA\.[A-Za-z0-9.]*" | sort | uniq -c
run() { timeout 60 "$@" || { echo "FAILED: $*"; rc=1; }; }
run "$O/attention_wgmma_check"
run "$O/attention_wgmma_fwd" 4 4096 12 64
run "$O/attention_wgmma_fwd" 32 1024 12 64
run "$O/attention_wgmma_fwd" 2 4096 16 128
run "$O/attention_wgmma_bwd" 1 128 2
run "$O/attention_wgmma_bwd" 4 4096 12
run "$O/attention_wgmma_bwd" 32 1024 12
run "$O/attention_wgmma_bwd" 1 8192 12
if python3 -c "import torch" 2> /dev/null; then
  for a in "--batch 4 --seq 4096" "--batch 32 --seq 1024" "--batch 1 --seq 8192" \
           "--batch 2 --seq 4096 --heads 16 --hd 128"; do
    timeout 120 python3 "$HERE/../torch_attention.py" $a | grep RESULT
  done
fi
exit $rc
