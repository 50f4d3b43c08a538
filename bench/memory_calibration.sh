#!/bin/bash
# Planned against measured device memory (docs/memory.md, "Planned against
# measured"), on a machine with 2 GPUs. A calibration, not a test.
#
#   bash bench/memory_calibration.sh [OUT_DIR] [family]
#
# With `family`, one GPU: three Llama-family presets at their own
# vocabularies (128256, 49152, 151936) on uint32 tokens (an llm.c version-2
# shard), instead of the GPT-2 rows and the seed scenario. With `lora`, one
# GPU: LoRA (r 16, alpha 32, q,v) on a bf16 and on an NF4 base (QLoRA), at
# llama-3.2-1b and llama-3.1-8b, T=2048 (docs/lora.md's plan rows among them).
#
# For each configuration, `shardtrain plan ... --json` gives the planned
# total per GPU; then 4 training steps run on synthetic tokens while
# nvidia-smi samples GPU 0's used memory every 100 ms; measured is the
# peak. Then the seed scenario: GPT-2 774M (1 GPU) and 1.5B (2 GPUs) at
# T=2048, global batch 32, `train --auto-fit-zero --gpu-mem 24GiB
# --enforce-gpu-mem`, whose use is cudaMemGetInfo's used memory (the
# metrics' maximum over ranks) less what --enforce-gpu-mem holds.
# Env: BIN (build-gpu/shardtrain), MPIRUN (mpirun --allow-run-as-root
# --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH).
set -u
O=${1:-/tmp/memcal}; mkdir -p "$O"
B=${BIN:-build-gpu/shardtrain}
MP=${MPIRUN:-mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
S=$O/synth.bin
python3 - "$S" <<'PY'
import sys, numpy as np
n = 16 * 1024 * 1024; h = np.zeros(256, np.int32); h[:3] = (20240520, 1, n)
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16).tobytes())
PY
run() { # ranks, then train's flags
  local np=$1; shift
  if [ "$np" -gt 1 ]; then timeout 300 $MP -np "$np" "$B" train "$@"
  else CUDA_VISIBLE_DEVICES=0 timeout 300 "$B" train "$@"; fi
}
cal() { # ranks model seq-len micro-batch zero recompute [data [train flags...]] (GPT-2 rows: 50257 tokens)
  local np=$1 m=$2 t=$3 mb=$4 z=$5 r=$6 data=${7:-}
  shift 7 2>/dev/null || shift $#
  local A=(--model "$m" --seq-len "$t" --micro-batch "$mb" --global-batch $((mb * np)) --zero "$z"
           --recompute "$r" --precision bf16 "$@")
  local planned
  planned=$("$B" plan "${A[@]}" --ranks "$np" --device cuda --gpu-mem 140GiB --json |
            python3 -c "import json,sys; print(json.load(sys.stdin)['bytes']['total'] // 2**20)")
  nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$O/smi.txt" &
  local smi=$!
  local D=(--data "$S" --vocab-size 50257)
  [ -n "$data" ] && D=(--data "$data")
  run "$np" "${D[@]}" "${A[@]}" --steps 4 --device cuda --out "$O/run" \
    --resume none --val-seqs 0 > "$O/run.log" 2>&1
  local rc=$?
  kill $smi; rm -rf "$O/run"
  [ "$rc" -ne 0 ] && grep -E -m2 "error" "$O/run.log" >&2
  local meas; meas=$(sort -n "$O/smi.txt" | tail -1)
  echo "| $np | $m${1:+ $*} | $t | $mb | $z | $r | $planned | $meas | $(python3 -c "print(f'{$meas / $planned:.4f}')") | rc $rc"
}
seed() { # ranks model
  local np=$1 m=$2
  run "$np" --data "$S" --vocab-size 50257 --model "$m" --seq-len 2048 --global-batch 32 \
    --gpu-mem 24GiB --enforce-gpu-mem --auto-fit-zero --steps 3 --device cuda --resume none \
    --val-seqs 0 --out "$O/seed" > "$O/seed_$m.log" 2>&1
  local rc=$?
  python3 - "$O/seed/metrics.jsonl" "$np" "$m" "$rc" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
plan, fit = lines[0]["memory_plan"], lines[0].get("auto_fit", {}).get("choice", {})
rows = [r for r in lines[1:] if "cuda_mem_used_bytes" in r]
used = max(r.get("cuda_mem_used_max_bytes", r["cuda_mem_used_bytes"]) for r in rows)
held = rows[0]["cuda_mem_total_bytes"] - (24 << 30)
planned, meas = plan["bytes"]["total"] >> 20, (used - held) >> 20
print(f"| {sys.argv[2]} | {sys.argv[3]} | 2048 | {fit.get('micro_batch')} | {fit.get('zero')} | "
      f"{fit.get('recompute')} | {planned} | {meas} | {meas / planned:.4f} | rc {sys.argv[4]}, "
      f"auto-fit under --enforce-gpu-mem 24GiB")
PY
  rm -rf "$O/seed"
}
echo "| ranks | model | T | micro-batch | ZeRO | recompute | planned MiB | measured MiB | measured / planned | |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
if [ "${2:-}" = "family" ] || [ "${2:-}" = "lora" ]; then
  for v in 128256 49152 151936; do
    python3 - "$O/synth_$v.bin" "$v" <<'PY'
import sys, numpy as np
n = 4 * 1024 * 1024; h = np.zeros(256, np.int32); h[:3] = (20240520, 2, n)
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, int(sys.argv[2]), n, dtype=np.uint32).tobytes())
PY
  done
  if [ "$2" = "lora" ]; then
    L=(--lora 16,alpha=32,dropout=0,targets=q,v)
    cal 1 llama-3.1-8b 2048 1 1 full "$O/synth_128256.bin" "${L[@]}"
    cal 1 llama-3.1-8b 2048 1 1 full "$O/synth_128256.bin" "${L[@]}" --base-dtype nf4
    cal 1 llama-3.2-1b 2048 4 1 none "$O/synth_128256.bin" "${L[@]}"
    cal 1 llama-3.2-1b 2048 4 1 none "$O/synth_128256.bin" "${L[@]}" --base-dtype nf4
    cal 1 llama-3.1-8b 2048 1 1 none "$O/synth_128256.bin" "${L[@]}"
    exit 0
  fi
  cal 1 llama-3.2-1b 2048 4 1 none "$O/synth_128256.bin"
  cal 1 smollm2-360m 2048 16 1 none "$O/synth_49152.bin"
  cal 1 qwen2.5-0.5b 2048 8 1 selective "$O/synth_151936.bin"
  exit 0
fi
cal 1 gpt2-124m 1024 32 0 none
cal 1 gpt2-124m 4096 8 1 full
cal 1 gpt2-350m 2048 8 1 selective
cal 2 gpt2-124m 1024 32 1 none
cal 2 gpt2-774m 2048 4 2 selective
seed 1 gpt2-774m
seed 2 gpt2-1558m
