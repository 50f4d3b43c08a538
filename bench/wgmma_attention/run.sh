#!/bin/bash
# The wgmma attention experiment (issue 17; docs/benchmarks.md, "wgmma
# attention experiment"): builds for sm_90a the general kernels'
# check (attention_wgmma.cuh: any T, GQA, bf16/fp16, head sizes 64/128) and
# the first forward and backward prototypes, checks them against their fp32
# references and times them, beside
# PyTorch's SDPA (flash and cuDNN backends) at the same shapes when PyTorch
# is there (optional: without it those rows are left out). A benchmark,
# not a test, and not used by the trainer; needs a Hopper GPU (H100/H200,
# compute capability 9.0) and nvcc that builds sm_90a (CUDA 12.0 or newer).
#
#   bash bench/wgmma_attention/run.sh [OUT_DIR]   (binaries; /tmp/wgmma_attention)
# Exit: 0 when every check passed, 1 when one failed or would not build, 2
# when no Hopper GPU or no nvcc is there (nothing is run).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
O=${1:-/tmp/wgmma_attention}
command -v nvcc > /dev/null || { echo "wgmma_attention: no nvcc on PATH (CUDA 12.0 or newer builds sm_90a)" >&2; exit 2; }
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1)
[ "$cc" = "9.0" ] || { echo "wgmma_attention: needs a Hopper GPU (compute capability 9.0); nvidia-smi reports '${cc:-no GPU}'" >&2; exit 2; }
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
