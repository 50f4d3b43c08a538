#!/bin/bash
# Issue 20's Llama 3.1 8B measurements in one device call on one H200, each
# a run of bench/lora_vs_peft.sh (ours and PEFT in the same call, peaks by
# nvidia-smi): a benchmark, not a test.
#
#   bash bench/lora_8b.sh PEERS_DIR [OUT.jsonl]
#
#   1. LoRA, bf16 base, T=2048, micro-batch 1, r 16 on q,v, a 24 GiB cap
#      (ours --gpu-mem 24GiB --enforce-gpu-mem, the peer
#      set_per_process_memory_fraction), recompute on both sides (our
#      --recompute full, the peer's gradient checkpointing);
#   2. the same without recompute on either side (each side may refuse or
#      run out of memory: the row says which);
#   3. QLoRA (--base-dtype nf4), 30 steps under a 16 GiB cap with recompute;
#      the peer stays bf16 (PEFT's LoRA, not QLoRA) under the same cap.
# Each row also carries our planned bytes (the run's "memory planned" line)
# next to nvidia-smi's peak, for the plan-against-measured check.
# Env as bench/lora_vs_peft.sh (BIN, WORK); OUT defaults to
# docs/bench/lora-DATE.jsonl.
set -u
# A missing argument: one usage line and exit 2, the project's code for a
# bad argument.
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: bench/lora_8b.sh PEERS_DIR [OUT.jsonl]" >&2
  exit 2
fi
PEERS=$1
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${2:-$HERE/../docs/bench/lora-$(date +%F).jsonl}
export OUT ENFORCE=1
run() { # label, then env assignments for lora_vs_peft.sh, then its arguments
  local label=$1; shift
  echo "=== $label"
  env "$@" 2>&1 | grep -E "^(RESULT|ROW)|memory     planned|SMI_PEAK|error" | cut -c1-400
}
run "LoRA 8B bf16 base, 24 GiB, recompute" CKPT=1 STEPS=20 \
  bash "$HERE/lora_vs_peft.sh" "$PEERS" llama-3.1-8b 1 2048 24
run "LoRA 8B bf16 base, 24 GiB, no recompute" CKPT=0 STEPS=20 \
  bash "$HERE/lora_vs_peft.sh" "$PEERS" llama-3.1-8b 1 2048 24
run "QLoRA 8B nf4 base, 16 GiB, recompute, 30 steps" CKPT=1 STEPS=30 BASE_DTYPE=nf4 \
  bash "$HERE/lora_vs_peft.sh" "$PEERS" llama-3.1-8b 1 2048 16
