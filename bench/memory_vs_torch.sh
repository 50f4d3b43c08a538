#!/bin/bash
# Peak device memory and tokens/s, shardtrain against the PyTorch peer
# (torch_gpt2.py: bf16 autocast, torch.compile, flash SDPA, fused AdamW), on
# one GPU, both sides in the same call, both measured the same way: the whole
# process's peak by nvidia-smi (smi_peak.sh). No activation checkpointing on the peer; ours runs each
# --recompute policy in POLICIES (default none).
# A benchmark, not a test (docs/memory.md, "Against PyTorch").
#
#   bash bench/memory_vs_torch.sh PEER_DIR OUT.jsonl "MODEL:T:MB ..."
#     PEER_DIR   folder holding torch_gpt2.py and smi_peak.sh (the team's
#                benchmark files, not in this repository)
#     OUT.jsonl  rows appended, one JSON object per shape: model, seq_len,
#                micro_batch, peer_tokens_per_s, tokens_per_s, ratio,
#                peer_mem_mib, mem_mib, mem_ratio, planned_mib, attention, date
#     MODEL      gpt2-124m, gpt2-350m, gpt2-774m or gpt2-1558m
#   Env: BIN (build-gpu/shardtrain), STEPS (12; the median of the steps after
#   the first 6), DEADLINE (epoch seconds: shapes that would start after
#   it are skipped and say so), ST_ARGS (extra train flags), POLICIES
#   ("none": ours once per --recompute policy named, e.g. "none selective",
#   against the one peer run of the shape; each row says its policy).
#
# Both sides: uniform random tokens below 50257 (vocabulary padded to 50304),
# one optimizer step per micro-batch (global batch = micro-batch), AdamW.
set -u
PEERS=${1:?usage: bench/memory_vs_torch.sh PEER_DIR OUT.jsonl "MODEL:T:MB ..."}
OUTJ=${2:?out.jsonl}; SHAPES=${3:?shapes}
BIN=${BIN:-build-gpu/shardtrain}
W=${WORK:-/tmp/st_mem_bench}; mkdir -p "$W"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
STEPS=${STEPS:-12}; WARM=6; DEADLINE=${DEADLINE:-0}
S=$W/synth.bin
[ -f "$S" ] || python3 - "$S" <<'PY'
import sys, numpy as np
n = 32 * 1024 * 1024; h = np.zeros(256, np.int32); h[:3] = (20240520, 1, n)
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16).tobytes())
PY
for spec in $SHAPES; do
  IFS=: read -r M T MB <<< "$spec"
  if [ "$DEADLINE" -gt 0 ] && [ $(( DEADLINE - $(date +%s) )) -lt 90 ]; then
    echo "SKIP $M T=$T micro-batch $MB: the call's deadline is near"; continue
  fi
  case $M in
    gpt2-124m) SHAPE="--layers 12 --heads 12 --dim 768" ;;
    gpt2-350m) SHAPE="--layers 24 --heads 16 --dim 1024" ;;
    gpt2-774m) SHAPE="--layers 36 --heads 20 --dim 1280" ;;
    gpt2-1558m) SHAPE="--layers 48 --heads 25 --dim 1600" ;;
    *) echo "memory_vs_torch.sh: model '$M' has no peer shape here" >&2; exit 2 ;;
  esac
  D=$W/$M-$T-$MB; rm -rf "$D"; mkdir -p "$D"
  CUDA_VISIBLE_DEVICES=0 timeout 200 bash "$PEERS/smi_peak.sh" -- python3 "$PEERS/torch_gpt2.py" \
    $SHAPE --seq "$T" --batch "$MB" --steps $((STEPS - WARM)) --warmup $WARM > "$D/peer.txt" 2>&1
  for POL in ${POLICIES:-none}; do
  rm -rf "$D/run"
  CUDA_VISIBLE_DEVICES=0 timeout 200 bash "$PEERS/smi_peak.sh" -- $BIN train --data "$S" \
    --vocab-size 50257 --model "$M" --seq-len "$T" --micro-batch "$MB" --global-batch "$MB" \
    --steps "$STEPS" --warmup 100 --lr 3e-4 --device cuda --precision bf16 --recompute "$POL" \
    --out "$D/run" --resume none --val-seqs 0 --log-every 1 --ckpt-every 0 ${ST_ARGS:-} \
    > "$D/st.txt" 2>&1
  cp "$D/st.txt" "$D/st-$POL.txt"
  python3 - "$D" "$M" "$T" "$MB" "$WARM" "$OUTJ" "$POL" <<'PY'
import json, os, re, sys, datetime
D, M, T, MB, WARM, OUTJ, POL = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
peer, st = open(os.path.join(D, "peer.txt")).read(), open(os.path.join(D, "st.txt")).read()
def smi(s):
    m = re.search(r"SMI_PEAK gpu=\d+ mib=(\d+) rc=(\d+)", s)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)
pm, prc = smi(peer); sm, src = smi(st)
m = re.search(r"tok_s=(\d+)", peer)
pt = float(m.group(1)) if m and prc == 0 else None
mf = os.path.join(D, "run", "metrics.jsonl")
rows = [json.loads(l) for l in open(mf) if '"tokens_per_s"' in l] if os.path.exists(mf) else []
tps = sorted(r["tokens_per_s"] for r in rows if r["step"] > WARM)
t = tps[len(tps) // 2] if tps and src == 0 else None
m = re.search(r"memory     planned ([\d.]+) GiB", st)
plan = float(m.group(1)) * 1024 if m else None
m = re.search(r"attention  (.*)", st)
att = m.group(1)[:60] if m else None
row = dict(model=M, seq_len=T, micro_batch=MB, recompute=POL, peer_tokens_per_s=pt, tokens_per_s=t,
           ratio=round(t / pt, 4) if t and pt else None, peer_mem_mib=pm if prc == 0 else None,
           mem_mib=sm if src == 0 else None,
           mem_ratio=round(sm / pm, 4) if sm and pm and prc == 0 and src == 0 else None,
           planned_mib=round(plan) if plan else None, attention=att,
           date=datetime.date.today().isoformat())
if prc != 0: row["peer_failed"] = (re.findall(r".*(?:Error|error).*", peer) or ["rc %s" % prc])[-1][:160]
if src != 0: row["failed"] = (re.findall(r"shardtrain: error.*", st) or ["rc %s" % src])[-1][:160]
open(OUTJ, "a").write(json.dumps(row) + "\n")
print("ROW " + json.dumps(row))
PY
  done
  rm -rf "$D/run"
done
