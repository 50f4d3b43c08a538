#!/bin/bash
# A/B tokens/s of one build: GPT-2 124M, bf16, uniform random tokens, 30
# steps, the median tokens/s of steps 11-30 and the last loss, on one
# line. Two builds compared in the same device call, runs alternated, is
# how docs/benchmarks.md measures a kernel change. A benchmark, not a test.
#
#   bash bench/ab_tokens.sh BIN TAG [MICRO_BATCH [SEQ_LEN]]
#
# BIN      a shardtrain built with CUDA (build-gpu/shardtrain after
#          tests/gpu/smoke.sh)
# TAG      names the run: its log is $WORK/TAG.log, its output $WORK/TAG/
# MICRO_BATCH (32) and SEQ_LEN (1024); the global batch is one micro-batch
#
# Environment: AB_ARGS, more train flags (e.g. "--attention flash" or
# "--gpu-mem 16GiB"); WORK (/tmp/st_ab), where the token file and runs go.
# Prints "AB TAG mbB TT median_tok_s N last_loss L"; exit 2 on bad
# arguments, 1 when the run fails (its log's last lines on stderr).
set -u
usage() { echo "usage: bench/ab_tokens.sh BIN TAG [MICRO_BATCH [SEQ_LEN]]" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 4 ] || usage
BIN=$1 TAG=$2 MB=${3:-32} T=${4:-1024}
[ -x "$BIN" ] || { echo "bench/ab_tokens.sh: BIN '$BIN' is not an executable shardtrain" >&2; exit 2; }
[[ "$TAG" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "bench/ab_tokens.sh: TAG '$TAG': letters, digits, . _ - only" >&2; exit 2; }
[[ "$MB" =~ ^[1-9][0-9]*$ ]] || { echo "bench/ab_tokens.sh: MICRO_BATCH '$MB' is not a positive whole number" >&2; exit 2; }
[[ "$T" =~ ^[1-9][0-9]*$ ]] || { echo "bench/ab_tokens.sh: SEQ_LEN '$T' is not a positive whole number" >&2; exit 2; }
WORK=${WORK:-/tmp/st_ab}
mkdir -p "$WORK" || exit 2
S=$WORK/synth.bin
# 64 Mi uniform tokens in llm.c's v1 .bin layout (256 int32 of header), made
# once: random tokens cost the same GEMMs and attention as text
# the first python with numpy: Debian's here, the PyTorch one on the GPU machine
PY=
for p in python3 /usr/bin/python3; do
  "$p" -c "import numpy" 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || { echo "bench/ab_tokens.sh: no python3 with numpy (apt install python3-numpy)" >&2; exit 1; }
[ -f "$S" ] || "$PY" - "$S" <<'PY' || exit 1
import sys, numpy as np
n = 64 * 1024 * 1024
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, n)
with open(sys.argv[1] + ".tmp", "wb") as f:
    f.write(h.tobytes())
    f.write(np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16).tobytes())
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
PY
rm -rf "${WORK:?}/$TAG"
# shellcheck disable=SC2086 # AB_ARGS is a list of flags
"$BIN" train --data "$S" --vocab-size 50257 --model gpt2-124m --seq-len "$T" \
  --micro-batch "$MB" --global-batch "$MB" --steps 30 --warmup 100 --lr 6e-4 \
  --device cuda --precision bf16 --out "$WORK/$TAG" --resume none --val-seqs 0 \
  --log-every 1 --ckpt-every 0 ${AB_ARGS:-} > "$WORK/$TAG.log" 2>&1 ||
  { tail -5 "$WORK/$TAG.log" >&2; exit 1; }
"$PY" - "$WORK/$TAG/metrics.jsonl" "$TAG" "$MB" "$T" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
t = sorted(r["tokens_per_s"] for r in rows if r["step"] > 10)
loss = [round(r["loss"], 6) for r in rows if "loss" in r]
if not t:
    sys.exit("bench/ab_tokens.sh: no step past 10 in " + sys.argv[1])
print(f"AB {sys.argv[2]} mb{sys.argv[3]} T{sys.argv[4]} median_tok_s {t[len(t)//2]:.0f} "
      f"last_loss {loss[-1] if loss else None}")
PY
