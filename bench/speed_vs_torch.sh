#!/bin/bash
# Training speed and peak memory over a matrix of shapes: shardtrain against
# the PyTorch peers (torch_gpt2.py for GPT-2 shapes, torch_llama.py for the
# Llama presets: bf16 autocast, torch.compile, flash SDPA, fused AdamW), on
# one GPU, every row's two sides in the same call, both measured the same
# way: tokens/s as the median step after warmup, peak memory of the whole
# process by nvidia-smi (smi_peak.sh), MFU against the bf16 matmul peak
# measured at the start of the call (bench/matmul_peak.py). A benchmark, not
# a test (docs/benchmarks.md).
#
#   bash bench/speed_vs_torch.sh PEER_DIR OUT.jsonl ["MODEL:T:MB ..."]
#     PEER_DIR   folder holding torch_gpt2.py, torch_llama.py and smi_peak.sh
#                (the team's benchmark files, not in this repository)
#     OUT.jsonl  rows appended, one JSON object per shape and policy: model,
#                seq_len, micro_batch, recompute, peer_tokens_per_s,
#                tokens_per_s, ratio, peer_mem_mib, mem_mib, mem_ratio,
#                planned_mib, peak_bf16_tflops, peer_mfu, mfu, attention, date,
#                st_args (ST_ARGS, when given)
#                (peer_failed / failed: the last error line of a side that
#                did not finish)
#     MODEL      gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, llama-3.2-1b or
#                smollm2-360m; default matrix: $DEFAULT_SHAPES below
#   Env: BIN (build-gpu/shardtrain), STEPS (20; the median of the steps
#   after WARM, 8), POLICIES (none: ours once per --recompute policy named,
#   against the one peer run of the shape), DEADLINE (epoch seconds: shapes
#   that would start after it are skipped, and say so), ST_ARGS (extra train
#   flags), PEAK (TFLOP/s: skip the measurement).
#   Exit 2: a missing argument, PEER_DIR without the three files, or BIN not
#   executable; 1: no peak, or no shape measured on both sides; else 0.
#
# Both sides: uniform random tokens below the vocabulary, one optimizer step
# per micro-batch (global batch = micro-batch), AdamW. FLOPs per token for
# MFU: 6N + 6LCT (N: the peer's parameter count, embeddings included; the
# PaLM appendix B count that llm.c and the peers use), the same for both.
set -u
DEFAULT_SHAPES="gpt2-124m:1024:32 gpt2-124m:2048:16 gpt2-124m:4096:8 gpt2-124m:1024:4
gpt2-350m:1024:16 gpt2-350m:2048:8 gpt2-774m:1024:8 gpt2-774m:4096:2 gpt2-1558m:1024:8
gpt2-1558m:2048:4"
# A missing argument: one usage line and exit 2, the project's code for a
# bad argument (not bash's ${1:?} message and exit 1).
if [ $# -lt 2 ] || [ -z "$1" ] || [ -z "$2" ]; then
  echo "usage: bench/speed_vs_torch.sh PEER_DIR OUT.jsonl [\"MODEL:T:MB ...\"]" >&2
  exit 2
fi
PEERS=$1; OUTJ=$2; SHAPES=${3:-$DEFAULT_SHAPES}
BIN=${BIN:-build-gpu/shardtrain}
for f in torch_gpt2.py torch_llama.py smi_peak.sh; do
  [ -f "$PEERS/$f" ] || { echo "speed_vs_torch: PEER_DIR $PEERS has no $f (the team's benchmark files)" >&2; exit 2; }
done
[ -x "$BIN" ] || { echo "speed_vs_torch: BIN $BIN is not an executable shardtrain; build it (tests/gpu/smoke.sh makes build-gpu/) or set BIN" >&2; exit 2; }
W=${WORK:-/tmp/st_speed_bench}; mkdir -p "$W"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
STEPS=${STEPS:-20}; WARM=${WARM:-8}; DEADLINE=${DEADLINE:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
PEAK=${PEAK:-$(python3 "$HERE/matmul_peak.py")}
[ -n "$PEAK" ] || { echo "speed_vs_torch: the bf16 matmul peak could not be measured (bench/matmul_peak.py; set PEAK to skip it)" >&2; exit 1; }
echo "peak_bf16_tflops=$PEAK"
# llm.c version-2 shards: uint16 tokens for GPT-2's 50257, uint32 for the rest
synth() { # FILE VOCAB
  [ -f "$1" ] || python3 - "$1" "$2" <<'PY'
import sys, numpy as np
V = int(sys.argv[2]); n = 32 * 1024 * 1024
dt = np.uint16 if V <= 65536 else np.uint32
h = np.zeros(256, np.int32); h[:3] = (20240520, 1 if dt == np.uint16 else 2, n)
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, V, n, dtype=dt).tobytes())
PY
}
START=$(date +%s); touch "$OUTJ"; ROWS0=$(wc -l < "$OUTJ")
for spec in $SHAPES; do
  IFS=: read -r M T MB <<< "$spec"
  if [ "$DEADLINE" -gt 0 ] && [ $(( DEADLINE - $(date +%s) )) -lt 90 ]; then
    echo "SKIP $M T=$T micro-batch $MB: the call's deadline is near"; continue
  fi
  case $M in
    gpt2-124m) PEER=torch_gpt2.py; V=50257; SHAPE="--layers 12 --heads 12 --dim 768" ;;
    gpt2-350m) PEER=torch_gpt2.py; V=50257; SHAPE="--layers 24 --heads 16 --dim 1024" ;;
    gpt2-774m) PEER=torch_gpt2.py; V=50257; SHAPE="--layers 36 --heads 20 --dim 1280" ;;
    gpt2-1558m) PEER=torch_gpt2.py; V=50257; SHAPE="--layers 48 --heads 25 --dim 1600" ;;
    llama-3.2-1b) PEER=torch_llama.py; V=128256
      SHAPE="--layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --tied 1 --rope-theta 500000" ;;
    smollm2-360m) PEER=torch_llama.py; V=49152
      SHAPE="--layers 32 --dim 960 --heads 15 --kv-heads 5 --ffn 2560 --vocab 49152 --tied 1 --rope-theta 100000" ;;
    *) echo "speed_vs_torch.sh: model '$M' has no peer shape here" >&2; exit 2 ;;
  esac
  S=$W/synth-$V.bin; synth "$S" "$V"
  VOCAB=""; [ "$PEER" = torch_gpt2.py ] && VOCAB="--vocab-size $V"
  D=$W/$M-$T-$MB; rm -rf "$D"; mkdir -p "$D"
  CUDA_VISIBLE_DEVICES=0 timeout 300 bash "$PEERS/smi_peak.sh" -- python3 "$PEERS/$PEER" \
    $SHAPE --seq "$T" --batch "$MB" --steps $((STEPS - WARM)) --warmup $WARM > "$D/peer.txt" 2>&1
  for POL in ${POLICIES:-none}; do
    rm -rf "$D/run"
    CUDA_VISIBLE_DEVICES=0 timeout 300 bash "$PEERS/smi_peak.sh" -- $BIN train --data "$S" $VOCAB \
      --model "$M" --seq-len "$T" --micro-batch "$MB" --global-batch "$MB" --steps "$STEPS" \
      --warmup 100 --lr 3e-4 --device cuda --precision bf16 --recompute "$POL" --out "$D/run" \
      --resume none --val-seqs 0 --log-every 1 --ckpt-every 0 ${ST_ARGS:-} > "$D/st-$POL.txt" 2>&1
    python3 - "$D" "$M" "$T" "$MB" "$WARM" "$OUTJ" "$POL" "$PEAK" "$SHAPE" <<'PY'
import json, os, re, sys, datetime
D, M, T, MB, WARM, OUTJ, POL, PEAK, SHAPE = sys.argv[1:10]
T, MB, WARM, PEAK = int(T), int(MB), int(WARM), float(PEAK)
peer, st = open(os.path.join(D, "peer.txt")).read(), open(os.path.join(D, f"st-{POL}.txt")).read()
def smi(s):
    m = re.search(r"SMI_PEAK gpu=\d+ mib=(\d+) rc=(\d+)", s)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)
def arg(name):
    return int(re.search(r"--%s (\d+)" % name, SHAPE).group(1))
pm, prc = smi(peer); sm, src = smi(st)
m = re.search(r"params=([\d.]+)M.*tok_s=(\d+)", peer)
N = float(m.group(1)) * 1e6 if m else None
pt = float(m.group(2)) if m and prc == 0 else None
mf = os.path.join(D, "run", "metrics.jsonl")
rows = [json.loads(l) for l in open(mf) if '"tokens_per_s"' in l] if os.path.exists(mf) else []
tps = sorted(r["tokens_per_s"] for r in rows if r["step"] > WARM)
t = tps[len(tps) // 2] if tps and src == 0 else None
m = re.search(r"memory     planned ([\d.]+) GiB", st)
plan = float(m.group(1)) * 1024 if m else None
m = re.search(r"attention  (.*)", st)
att = m.group(1)[:120] if m else None
flops = 6 * N + 6 * arg("layers") * arg("dim") * T if N else None
mfu = lambda tok: round(flops * tok / 1e12 / PEAK, 4) if flops and tok else None
row = dict(model=M, seq_len=T, micro_batch=MB, recompute=POL, peer_tokens_per_s=pt, tokens_per_s=t,
           ratio=round(t / pt, 4) if t and pt else None, peer_mem_mib=pm if prc == 0 else None,
           mem_mib=sm if src == 0 else None,
           mem_ratio=round(sm / pm, 4) if sm and pm and prc == 0 and src == 0 else None,
           planned_mib=round(plan) if plan else None, peak_bf16_tflops=PEAK, peer_mfu=mfu(pt),
           mfu=mfu(t), attention=att, date=datetime.date.today().isoformat())
if os.environ.get("ST_ARGS", "").strip(): row["st_args"] = os.environ["ST_ARGS"].strip()
if prc != 0: row["peer_failed"] = (re.findall(r".*(?:Error|error).*", peer) or ["rc %s" % prc])[-1][:160]
if src != 0: row["failed"] = (re.findall(r"shardtrain: error.*", st) or ["rc %s" % src])[-1][:160]
open(OUTJ, "a").write(json.dumps(row) + "\n")
print("ROW " + json.dumps(row))
PY
  done
  rm -rf "$D/run"
done
# The table of the rows this call appended
python3 - "$OUTJ" "$ROWS0" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
f = lambda x, fmt: format(x, fmt) if x is not None else "-"
print(f"{'model':12s} {'T':>5s} {'mb':>3s} {'policy':9s} {'peer tok/s':>10s} {'ours':>10s} {'ratio':>6s} "
      f"{'peer MFU':>8s} {'MFU':>6s} {'peer MiB':>8s} {'MiB':>7s} {'mem':>6s}")
for r in rows:
    print(f"{r['model']:12s} {r['seq_len']:5d} {r['micro_batch']:3d} {r['recompute']:9s} "
          f"{f(r['peer_tokens_per_s'], '10.0f')} {f(r['tokens_per_s'], '10.0f')} {f(r['ratio'], '6.3f')} "
          f"{f(r['peer_mfu'] and 100 * r['peer_mfu'], '7.1f')}% {f(r['mfu'] and 100 * r['mfu'], '5.1f')}% "
          f"{f(r['peer_mem_mib'], '8d')} {f(r['mem_mib'], '7d')} {f(r['mem_ratio'], '6.3f')}"
          + (f"  peer: {r['peer_failed']}" if 'peer_failed' in r else "")
          + (f"  ours: {r['failed']}" if 'failed' in r else ""))
PY
echo "speed_vs_torch: $(echo $SHAPES | wc -w) shapes in $(( $(date +%s) - START )) s"
# exit 1 when no shape gave both sides' tokens/s: a benchmark that measured nothing failed
python3 - "$OUTJ" "$ROWS0" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
sys.exit(0 if any(r.get("ratio") for r in rows) else 1)
PY
