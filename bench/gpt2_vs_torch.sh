#!/bin/bash
# GPT-2 124M training throughput: shardtrain against the PyTorch peer
# (torch_gpt2.py: bf16 autocast, torch.compile, flash SDPA, fused AdamW; DDP
# under torchrun), in one call on the same GPUs. A benchmark, not a test.
#
#   bash bench/gpt2_vs_torch.sh PEER.py [GPUS] [PRECISION] [MICRO_BATCH]
#     PEER.py     path to torch_gpt2.py, the PyTorch peer (not in this repository:
#                 it is kept with the team's benchmark files; docs/benchmarks.md)
#     GPUS        1 or more (default 1); >1 runs torchrun and mpirun
#     PRECISION   bf16 (default), fp16 or fp32 for shardtrain
#     MICRO_BATCH sequences per GPU per step (default 32)
#
# Both sides: T=1024, uniform random tokens below 50257 (vocabulary padded to
# 50304), one optimizer step per micro-batch, median step time after warmup.
# Prints tokens/s of each, the ratio, TFLOP/s per GPU with 6N + 6LCT FLOPs
# per token (N parameters with the embedding, L layers, C width, T
# sequence), MFU against the bf16 matmul peak measured here with torch, and
# peak device memory (torch's allocator; nvidia-smi's sampled maximum for
# shardtrain, which includes the CUDA context).
set -eu
# A missing argument: one usage line and exit 2, the project's code for a
# bad argument (not bash's ${1:?} message and exit 1).
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: bench/gpt2_vs_torch.sh PEER.py [GPUS] [PRECISION] [MICRO_BATCH]" >&2
  exit 2
fi
PEER=$1
GPUS=${2:-1}; PREC=${3:-bf16}; MB=${4:-32}
BIN=${BIN:-build-gpu/shardtrain}
W=${WORK:-/tmp/st_bench}; rm -rf $W; mkdir -p $W
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
T=1024; STEPS=${STEPS:-30}; WARM=10
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -$GPUS

echo "== bf16 matmul peak (torch.matmul 8192^3, GPU 0)"
PEAK=$(python3 "$(dirname "$0")/matmul_peak.py")
echo "peak_bf16_tflops=$PEAK"

echo "== synthetic tokens"
python3 - "$W/synth.bin" <<'PY'
import sys, numpy as np
r = np.random.default_rng(0)
n = 64 * 1024 * 1024  # 64M tokens: no epoch boundary within the run
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, n)
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(r.integers(0, 50257, n, dtype=np.uint16).tobytes())
PY

echo "== peer: torch_gpt2.py, $GPUS GPU(s), micro-batch $MB"
if [ "$GPUS" -gt 1 ]; then
  timeout 400 torchrun --standalone --nproc_per_node $GPUS $PEER --batch $MB --steps $((STEPS - WARM)) --warmup $WARM 2>&1 | grep RESULT | tee $W/peer.txt
else
  CUDA_VISIBLE_DEVICES=0 timeout 400 python3 $PEER --batch $MB --steps $((STEPS - WARM)) --warmup $WARM 2>&1 | grep RESULT | tee $W/peer.txt
fi

echo "== shardtrain $PREC, $GPUS GPU(s), micro-batch $MB"
ARGS="train --data $W/synth.bin --vocab-size 50257 --model gpt2-124m --seq-len $T --micro-batch $MB --global-batch $((MB * GPUS)) --steps $STEPS --warmup 100 --lr 6e-4 --device cuda --precision $PREC --out $W/run --resume none --val-seqs 0 --log-every 10"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $W/mem.txt &
SMI=$!
if [ "$GPUS" -gt 1 ]; then
  timeout 400 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np $GPUS $BIN $ARGS 2>&1 | tee $W/st.txt | grep -E "step |error|backend"
else
  CUDA_VISIBLE_DEVICES=0 timeout 400 $BIN $ARGS 2>&1 | tee $W/st.txt | grep -E "step |error|backend"
fi
kill $SMI 2>/dev/null || true

python3 - "$W" "$PEAK" "$GPUS" "$T" <<'PY'
import json, re, sys, os
W, peak, gpus, T = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
peer = open(os.path.join(W, "peer.txt")).read()
pt = float(re.search(r"tok_s=(\d+)", peer).group(1))
pmem = float(re.search(r"peak_mem_gib=([\d.]+)", peer).group(1))
rows = [json.loads(l) for l in open(os.path.join(W, "run", "metrics.jsonl")) if '"tokens_per_s"' in l]
tps = sorted(r["tokens_per_s"] for r in rows if r["step"] > 10)
st = tps[len(tps) // 2]
# N as shardtrain prints it: the padded 50304 x 768 embedding included, as the peer counts it
N = int(re.search(r"params\s+(\d+)", open(os.path.join(W, "st.txt")).read()).group(1))
L, C = 12, 768
flops = 6 * N + 6 * L * C * T
mem = [int(x) for x in open(os.path.join(W, "mem.txt")).read().split() if x.isdigit()]
for name, t in (("torch+compile", pt), ("shardtrain", st)):
    tf = flops * t / gpus / 1e12
    print(f"RESULT {name:14s} tokens/s {t:10.0f}  TFLOP/s/GPU {tf:6.1f}  MFU {100 * tf / peak:5.1f}%")
print(f"RESULT ratio shardtrain / torch+compile = {st / pt:.3f} ({gpus} GPU(s))")
print(f"RESULT peak memory: torch allocator {pmem:.2f} GiB; shardtrain (nvidia-smi, incl. context) "
      f"{max(mem) / 1024 if mem else float('nan'):.2f} GiB")
PY
