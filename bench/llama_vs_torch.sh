#!/bin/bash
# Llama-family training throughput and peak memory: shardtrain against the
# PyTorch peer (torch_llama.py: bf16 autocast, torch.compile, SDPA with GQA,
# fused AdamW) on one GPU, both sides in the same call. A benchmark, not a test.
#
#   bash bench/llama_vs_torch.sh PEER_DIR PRESET MICRO_BATCH [T]
#     PEER_DIR     folder holding torch_llama.py and smi_peak.sh (the team's
#                  benchmark files, not in this repository: docs/benchmarks.md)
#     PRESET       llama-3.2-1b or smollm2-360m (the shapes both sides build)
#     MICRO_BATCH  sequences per step (both sides; one optimizer step each)
#     T            sequence length (default 2048)
#   RECOMPUTE="none selective" (env) runs shardtrain once per recompute
#   policy against the one peer run (default: none).
#
# Both sides: uniform random tokens below the vocabulary, bf16, AdamW with
# weight decay 0.1 and gradient clipping at 1.0, median step time after
# warmup. Prints tokens/s of each, the ratio, TFLOP/s with the peer's count
# (6N + 6LCT per token, N every parameter once), MFU against the bf16 matmul
# peak measured here with torch, and the peak device memory of each whole
# process by nvidia-smi (smi_peak.sh: CUDA context and workspaces included).
set -eu
# A missing argument: one usage line and exit 2, the project's code for a
# bad argument (not bash's ${1:?} message and exit 1).
if [ $# -lt 3 ] || [ -z "$1" ] || [ -z "$2" ] || [ -z "$3" ]; then
  echo "usage: bench/llama_vs_torch.sh PEER_DIR PRESET MICRO_BATCH [T]" >&2
  exit 2
fi
PEERS=$1; PRESET=$2; MB=$3; T=${4:-2048}
BIN=${BIN:-build-gpu/shardtrain}
W=${WORK:-/tmp/st_llama_bench}/$PRESET-$MB-$T; rm -rf "$W"; mkdir -p "$W"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
STEPS=${STEPS:-30}; WARM=10
case $PRESET in
  llama-3.2-1b) SHAPE="--layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --tied 1 --rope-theta 500000" ;;
  smollm2-360m) SHAPE="--layers 32 --dim 960 --heads 15 --kv-heads 5 --ffn 2560 --vocab 49152 --tied 1 --rope-theta 100000" ;;
  *) echo "llama_vs_torch.sh: preset '$PRESET' has no peer shape here; use llama-3.2-1b or smollm2-360m" >&2; exit 2 ;;
esac
V=$(echo "$SHAPE" | sed 's/.*--vocab \([0-9]*\).*/\1/')
L=$(echo "$SHAPE" | sed 's/.*--layers \([0-9]*\).*/\1/')
C=$(echo "$SHAPE" | sed 's/.*--dim \([0-9]*\).*/\1/')
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1

PEAK=$(python3 "$(dirname "$0")/matmul_peak.py")
echo "peak_bf16_tflops=$PEAK"

# llm.c version-2 shard: uint32 tokens (the vocabularies here pass 65536)
python3 - "$W/synth.bin" "$V" "$((MB * (T + 1) * (STEPS + 2)))" <<'PY'
import sys, numpy as np
r = np.random.default_rng(0)
n = int(sys.argv[3])
h = np.zeros(256, np.int32); h[:3] = (20240520, 2, n)
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(r.integers(0, int(sys.argv[2]), n, dtype=np.uint32).tobytes())
PY

echo "== peer: torch_llama.py $PRESET shape, micro-batch $MB, T=$T"
CUDA_VISIBLE_DEVICES=0 timeout 240 bash "$PEERS/smi_peak.sh" -- python3 "$PEERS/torch_llama.py" $SHAPE \
  --seq "$T" --batch "$MB" --steps $((STEPS - WARM)) --warmup $WARM > "$W/peer.txt" 2>&1 || true
grep -E "RESULT|SMI_PEAK|Error|error" "$W/peer.txt" | tail -4

RECOMPUTE=${RECOMPUTE:-none}
for rec in $RECOMPUTE; do
  echo "== shardtrain $PRESET bf16, micro-batch $MB, T=$T, recompute $rec"
  ARGS="train --data $W/synth.bin --model $PRESET --seq-len $T --micro-batch $MB --global-batch $MB
    --steps $STEPS --warmup 100 --lr 3e-4 --grad-clip 1.0 --device cuda --precision bf16
    --recompute $rec --out $W/run-$rec --resume none --val-seqs 0 --log-every 10 --ckpt-every 0"
  CUDA_VISIBLE_DEVICES=0 timeout 240 bash "$PEERS/smi_peak.sh" -- $BIN $ARGS > "$W/st-$rec.txt" 2>&1 || true
  grep -E "step |error|memory     planned|SMI_PEAK" "$W/st-$rec.txt" | cut -c1-160 | tail -6
  rm -rf "$W/run-$rec/ckpt"
done

python3 - "$W" "$PEAK" "$T" "$L" "$C" "$MB" $RECOMPUTE <<'PY'
import json, re, sys, os
W, peak = sys.argv[1], float(sys.argv[2])
T, L, C, MB = map(int, sys.argv[3:7])
recs = sys.argv[7:]
peer = open(os.path.join(W, "peer.txt")).read()
def smi(s):
    m = re.search(r"SMI_PEAK gpu=\d+ mib=(\d+) rc=(\d+)", s)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)
def planned(s):
    m = re.search(r"memory     planned ([\d.]+) GiB", s)
    return float(m.group(1)) * 1024 if m else None
pm, prc = smi(peer)
m = re.search(r"params=([\d.]+)M.*tok_s=(\d+)", peer)
N = float(m.group(1)) * 1e6 if m else None
pt = float(m.group(2)) if m else None
flops = 6 * N + 6 * L * C * T if N else None
rows = [("torch+compile", pt, pm, prc, None)]
for rec in recs:
    out = open(os.path.join(W, f"st-{rec}.txt")).read()
    sm, src = smi(out)
    mf = os.path.join(W, f"run-{rec}", "metrics.jsonl")
    ms = [json.loads(l) for l in open(mf) if '"tokens_per_s"' in l] if os.path.exists(mf) else []
    tps = sorted(r["tokens_per_s"] for r in ms if r["step"] > 10)
    rows.append((f"shardtrain {rec}", tps[len(tps) // 2] if tps else None, sm, src, planned(out)))
for name, t, mem, rc, plan in rows:
    if t is None or flops is None:
        print(f"RESULT {name:20s} no throughput (rc={rc}, peak {mem} MiB)"); continue
    tf = flops * t / 1e12
    extra = f", planned {plan:.0f} MiB ({mem / plan:.4f} of it measured)" if plan and mem else ""
    print(f"RESULT {name:20s} tokens/s {t:9.0f}  TFLOP/s {tf:6.1f}  MFU {100 * tf / peak:5.1f}%  "
          f"peak {mem} MiB (nvidia-smi){extra}")
    if name != "torch+compile" and pt and mem and pm:
        print(f"RESULT ratio {name} / torch+compile = {t / pt:.3f}; memory {mem} / {pm} MiB "
              f"= {mem / pm:.3f} (micro-batch {MB}, T={T})")
PY
