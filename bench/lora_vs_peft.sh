#!/bin/bash
# LoRA fine-tuning throughput and peak memory: `shardtrain train --lora`
# against the PyTorch peer (bench/peft_lora.py: transformers + PEFT, bf16
# frozen base, fp32 adapters, bf16 autocast, SDPA, fused AdamW on the
# adapters) on one GPU, both sides in the same call, both measured the same
# way: the whole process's peak by nvidia-smi (smi_peak.sh). A benchmark,
# not a test.
#
#   bash bench/lora_vs_peft.sh PEERS_DIR PRESET MICRO_BATCH SEQ_LEN [GPU_MEM_GIB]
#     PEERS_DIR    folder holding smi_peak.sh (the team's benchmark files, not
#                  in this repository: docs/benchmarks.md)
#     PRESET       one of shardtrain's presets (llama-3.2-1b, llama-3.1-8b,
#                  gpt2-124m, ...; bench/peft_lora.py builds the same shape)
#     MICRO_BATCH  sequences per step (both sides; one optimizer step each)
#     SEQ_LEN      tokens per sequence
#     GPU_MEM_GIB  optional cap: ours plans against --gpu-mem GPU_MEM_GIB GiB
#                  (and refuses, exit 6, when it does not fit), the peer runs
#                  under torch.cuda.set_per_process_memory_fraction(cap / total)
#   Env: BIN (build-gpu/shardtrain), STEPS (20), WARM (5: steps left out of
#   the median), RANK (16), ALPHA (32), TARGETS (the family's default: q,v
#   for Llama/Qwen2, qkv for GPT-2; our names), CKPT (0: no recompute on
#   either side; 1: ours --recompute full, each block rerun before its
#   backward, and the peer's gradient checkpointing of each decoder layer,
#   which is the same policy), BASE_DTYPE (bf16; nf4 for QLoRA on ours only:
#   the peer stays bf16, say so when you quote it), ENFORCE (1: ours also
#   --enforce-gpu-mem; its nvidia-smi peak then counts the memory it holds
#   back), OUT (a .jsonl file the rows are appended to), ST_ARGS (extra
#   train flags), WORK (/tmp/st_lora_bench).
#   BASE: the frozen base of our side.
#     (unset)  `train --model PRESET --lora ...`: a random initialisation of
#              the preset (needs --lora on a fresh model);
#     make     peft_lora.py --save-base writes a random Hugging Face model of
#              the preset (bf16) and both sides start from it (ours by
#              `train --init-from`, the peer by from_pretrained);
#     PATH     a Hugging Face directory or run/step directory for
#              --init-from; the peer loads PATH too when it is a Hugging Face
#              directory (config.json), else builds the preset's shape.
#
# Both sides: uniform random tokens below the vocabulary, AdamW (0.9, 0.95,
# eps 1e-8, weight decay 0.1) at lr 1e-4, gradient clipping 1.0, dropout 0,
# median step time after the warmup. Prints a table and one JSON line per
# run: model, seq_len, micro_batch, rank, targets, tokens_per_s,
# peer_tokens_per_s, ratio, mem_mib, peer_mem_mib, date (and ckpt, alpha,
# gpu_mem_gib, base, planned: our plan's total, peer_max_allocated_mib,
# failures).
set -u
# A missing argument: one usage line and exit 2, the project's code for a
# bad argument.
if [ $# -lt 4 ] || [ -z "$1" ] || [ -z "$2" ] || [ -z "$3" ] || [ -z "$4" ]; then
  echo "usage: bench/lora_vs_peft.sh PEERS_DIR PRESET MICRO_BATCH SEQ_LEN [GPU_MEM_GIB]" >&2
  exit 2
fi
PEERS=$1
PRESET=$2; MB=$3; T=$4; CAP=${5:-}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-build-gpu/shardtrain}
STEPS=${STEPS:-20}; WARM=${WARM:-5}; RANK=${RANK:-16}; ALPHA=${ALPHA:-32}; CKPT=${CKPT:-0}
BASE=${BASE:-}; BASE_DTYPE=${BASE_DTYPE:-bf16}
case $PRESET in
  gpt2-*) FAMILY=gpt2; V=50257; TARGETS=${TARGETS:-qkv} ;;
  llama-*|smollm2-*|qwen2.5-*) FAMILY=llama; TARGETS=${TARGETS:-q,v}
    case $PRESET in qwen2.5-*) V=151936 ;; smollm2-*) V=49152 ;; *) V=128256 ;; esac ;;
  *) echo "lora_vs_peft.sh: preset '$PRESET' unknown here; use a gpt2-*, llama-*, qwen2.5-* or smollm2-* preset" >&2; exit 2 ;;
esac
[ "$STEPS" -gt "$WARM" ] || { echo "lora_vs_peft.sh: STEPS ($STEPS) must exceed WARM ($WARM)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "lora_vs_peft.sh: $BIN is not built (cmake --build build-gpu)" >&2; exit 2; }
W=${WORK:-/tmp/st_lora_bench}/$PRESET-$MB-$T-r$RANK-c$CKPT; rm -rf "$W"; mkdir -p "$W"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1

# llm.c version-2 shard of uint32 tokens below V (GPT-2's: version 1, uint16)
python3 - "$W/synth.bin" "$V" "$((MB * (T + 1) * (STEPS + 2)))" <<'PY'
import sys, numpy as np
V, n = int(sys.argv[2]), int(sys.argv[3])
wide = V > 65536
h = np.zeros(256, np.int32); h[:3] = (20240520, 2 if wide else 1, n)
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes())
    f.write(np.random.default_rng(0).integers(0, V, n, dtype=np.uint32 if wide else np.uint16).tobytes())
PY

PEER_BASE=()
case $BASE in
  "") SRC=(--model "$PRESET") ;;
  make)
    echo "== base: a random $PRESET in bf16 (transformers save_pretrained) -> $W/base"
    python3 "$HERE/peft_lora.py" --preset "$PRESET" --seq "$T" --save-base "$W/base" || exit 1
    SRC=(--init-from "$W/base"); PEER_BASE=(--base "$W/base") ;;
  *) SRC=(--init-from "$BASE"); [ -f "$BASE/config.json" ] && PEER_BASE=(--base "$BASE") ;;
esac

PEER_CAP=(); ST_CAP=()
if [ -n "$CAP" ]; then
  PEER_CAP=(--mem-gib "$CAP"); ST_CAP=(--gpu-mem "${CAP}GiB")
  [ "${ENFORCE:-0}" = 1 ] && ST_CAP+=(--enforce-gpu-mem)
fi
REC=none; [ "$CKPT" = 1 ] && REC=full

echo "== peer: peft_lora.py $PRESET, micro-batch $MB, T=$T, r $RANK, alpha $ALPHA, targets $TARGETS, ckpt $CKPT${CAP:+, cap $CAP GiB}"
CUDA_VISIBLE_DEVICES=0 timeout 400 bash "$PEERS/smi_peak.sh" -- python3 "$HERE/peft_lora.py" \
  --preset "$PRESET" "${PEER_BASE[@]}" --batch "$MB" --seq "$T" --steps $((STEPS - WARM)) \
  --warmup "$WARM" --rank "$RANK" --alpha "$ALPHA" --targets "$TARGETS" --ckpt "$CKPT" \
  "${PEER_CAP[@]}" > "$W/peer.txt" 2> "$W/peer.err"
grep -E "^\{|SMI_PEAK" "$W/peer.txt" | cut -c1-300 | tail -2
grep -E "Error|error" "$W/peer.err" | tail -2

echo "== shardtrain $PRESET --lora $RANK,alpha=$ALPHA,targets=$TARGETS, base $BASE_DTYPE, recompute $REC${CAP:+, --gpu-mem ${CAP}GiB}"
CUDA_VISIBLE_DEVICES=0 timeout 400 bash "$PEERS/smi_peak.sh" -- "$BIN" train "${SRC[@]}" \
  --data "$W/synth.bin" --seq-len "$T" --micro-batch "$MB" --global-batch "$MB" \
  --lora "$RANK,alpha=$ALPHA,dropout=0,targets=$TARGETS" --base-dtype "$BASE_DTYPE" \
  --steps "$STEPS" --warmup 0 --lr 1e-4 --grad-clip 1.0 --device cuda --precision bf16 \
  --recompute "$REC" "${ST_CAP[@]}" --out "$W/run" --resume none --val-seqs 0 --log-every 5 \
  --ckpt-every 0 ${ST_ARGS:-} > "$W/st.txt" 2>&1
grep -E "step |error|memory     planned|SMI_PEAK" "$W/st.txt" | cut -c1-160 | tail -5
rm -rf "$W/run/ckpt"

python3 - "$W" "$PRESET" "$T" "$MB" "$RANK" "$ALPHA" "$TARGETS" "$CKPT" "$WARM" "${CAP:-}" \
  "${BASE:-random}" "$BASE_DTYPE" "${OUT:-}" <<'PY'
import datetime, json, os, re, sys
W, M, T, MB, R, ALPHA, TG, CK, WARM, CAP, BASE, BDT, OUTJ = sys.argv[1:14]
T, MB, R, WARM = int(T), int(MB), int(R), int(WARM)
peer, st = open(os.path.join(W, "peer.txt")).read(), open(os.path.join(W, "st.txt")).read()
perr = open(os.path.join(W, "peer.err")).read()
def smi(s):
    m = re.search(r"SMI_PEAK gpu=\d+ mib=(\d+) rc=(\d+)", s)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)
pm, prc = smi(peer); sm, src = smi(st)
pj = [json.loads(l) for l in peer.splitlines() if l.startswith("{")]
pj = pj[-1] if pj else {}
pt = pj.get("tokens_per_s") if prc == 0 else None
mf = os.path.join(W, "run", "metrics.jsonl")
rows = [json.loads(l) for l in open(mf) if '"tokens_per_s"' in l] if os.path.exists(mf) else []
tps = sorted(r["tokens_per_s"] for r in rows if r.get("step", 0) > WARM)
t = tps[len(tps) // 2] if tps and src == 0 else None
row = dict(model=M, seq_len=T, micro_batch=MB, rank=R, alpha=float(ALPHA), targets=TG,
           ckpt=int(CK), tokens_per_s=t, peer_tokens_per_s=pt,
           ratio=round(t / pt, 4) if t and pt else None,
           mem_mib=sm if src == 0 else None, peer_mem_mib=pm if prc == 0 else None,
           peer_max_allocated_mib=pj.get("max_allocated_mib"),
           gpu_mem_gib=float(CAP) if CAP else None, base=BASE, base_dtype=BDT,
           planned=(re.findall(r"memory     planned (\S+ \S+) per", st) or [None])[0],
           loss_first=rows[0].get("loss") if rows else None,
           peer_loss_first=pj.get("loss_first"), peer=dict(
               torch=pj.get("torch"), transformers=pj.get("transformers"), peft=pj.get("peft")),
           date=datetime.date.today().isoformat())
if prc != 0:
    row["peer_failed"] = pj.get("error") or (re.findall(r".*(?:Error|error).*", perr) or
                                             ["rc %s" % prc])[-1][:200]
if src != 0:
    row["failed"] = (re.findall(r"shardtrain: error.*", st) or ["rc %s" % src])[-1][:200]
def f(x, w=9, p=0):
    return f"{x:{w}.{p}f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"
print(f"RESULT {'side':12s} {'tokens/s':>9s} {'peak MiB':>9s}   ({M}, B={MB}, T={T}, r={R}, "
      f"targets {TG}, ckpt {CK}{', cap %s GiB' % CAP if CAP else ''})")
print(f"RESULT {'shardtrain':12s} {f(t)} {f(row['mem_mib'])}" + (f"   {row['failed']}" if src else ""))
print(f"RESULT {'peft':12s} {f(pt)} {f(row['peer_mem_mib'])}" +
      (f"   {row['peer_failed']}" if prc else ""))
if row["ratio"]:
    mr = f", memory {sm / pm:.3f}" if sm and pm and not src and not prc else ""
    print(f"RESULT ratio shardtrain / peft = {row['ratio']:.3f}{mr}")
print("ROW " + json.dumps(row))
if OUTJ:
    open(OUTJ, "a").write(json.dumps(row) + "\n")
PY
