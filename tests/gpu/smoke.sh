#!/usr/bin/env bash
# tests/gpu/smoke.sh - the GPU smoke test, for a machine with one GPU. Run it
# on the tree you are about to submit whenever a change touches GPU-side,
# trainer or build code:
#
#   bash tests/gpu/smoke.sh            (from the repository root)
#
# 1. builds with CUDA into build-gpu/ (warnings are errors);
# 2. runs the CUDA ctest (every test whose name has "cuda"), in the
#    background beside 3-5, its verdict reported last;
# 3. trains a few steps for every precision (bf16, fp16, fp32) x attention
#    (cudnn, mixed, flash) x ZeRO stage (0, 1, 2) at the tiny shape, each recompute
#    policy more than once (full's losses identical to none's, act's to
#    selective's), and a subset
#    at gpt2-124m; each run must exit 0 with finite losses that fall; fp32
#    with --attention cudnn or mixed must be refused with exit 2 (cuDNN's
#    fused attention is bf16/fp16 only);
#    the default GEMM search (exact: only algorithms bit-identical to the
#    heuristic's first) against none, losses bit-identical;
#    ST_GEMM_SEARCH's choices through ST_GEMM_CACHE (a second run reads
#    them and its losses are bit-identical to the first's);
#    --attention auto under a budget running cuDNN's backward in groups of
#    sequences, bit-identical to one call for the micro-batch;
#    ZeRO 3 (bit-identical to ZeRO 2) and ZeRO 3 with the optimizer offloaded;
#    asynchronous checkpoints equal --ckpt-async off's, dataset by dataset;
#    --dump-grads of CUDA fp32 against the CPU's (grads diff --tol 1e-4);
# 4. stops a run with --stop-after, resumes it and checks that the resumed
#    losses equal an uninterrupted run's exactly, then `ckpt verify`;
# 5. ST_TIMELINE and --gpu-stats-every once each (the GPU-only code paths);
#    sample and eval on CUDA against the CPU (greedy ids, eval loss), and
#    an imported Hugging Face model against transformers (tests/data/hf);
#    the Llama family: an imported llama-tiny across precisions, attention
#    kernels, ZeRO stages and recompute, a wider GQA Llama and an MQA Qwen2,
#    sample/eval on CUDA against the CPU, and a bit-exact resume;
#    LoRA on the imported llama-tiny across precisions, ZeRO stages and
#    recompute, the same with an NF4 base (QLoRA), and bit-exact LoRA and
#    QLoRA resumes.
#
# Exits non-zero on any failure and ends with one line:
#   smoke: N passed, M failed (GPU, tree DIGEST, seconds)
# where DIGEST is `bash tests/gpu/smoke.sh --tree-id` of the tree it ran on.
# Needs data/kjv.h5 (scripts/demo.sh makes it; or carry data/ to the GPU
# machine). Debian cjson/cmocka/pcre2/openssl .deb files in .device/debs (git-ignored) are
# unpacked when the machine lacks them (the GPU machine has no apt).
set -u
cd "$(dirname "$0")/../.."
# A digest of the working tree's files (tracked and untracked, not ignored),
# so the summary line names the tree it ran on; `--tree-id` prints it alone,
# to compare with the tree you submit.
tree_id() {
  git ls-files -co --exclude-standard -z 2>/dev/null | LC_ALL=C sort -z |
    xargs -0 sha1sum 2>/dev/null | sha1sum | cut -c1-12
}
if [ "${1:-}" = "--tree-id" ]; then tree_id; exit 0; fi
R=$PWD
O=${OUT:-/tmp/smoke}
mkdir -p "$O"
W=$O/runs
rm -rf "$W"
mkdir -p "$W"
LOG=$O/smoke.log
: > "$LOG"
export NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
t_start=$(date +%s)
pass=0
fail=0
failed=()

say() { echo "$*" | tee -a "$LOG"; }
ok() { pass=$((pass + 1)); say "PASS $1${2:+: $2}"; }
bad() { fail=$((fail + 1)); failed+=("$1"); say "FAIL $1${2:+: $2}"; }

summary() {
  local secs=$(( $(date +%s) - t_start ))
  local gpu
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  local extra=""
  [ "$fail" -gt 0 ] && extra="; failed: ${failed[*]}"
  echo "smoke: $pass passed, $fail failed (${gpu:-no GPU}, tree $(tree_id), ${secs} s$extra)" | tee -a "$LOG"
  [ "$fail" -eq 0 ]
  exit $?
}

if ! nvidia-smi -L >/dev/null 2>&1; then
  bad gpu "nvidia-smi sees no GPU: run this on a machine with one"
  summary
fi
nvidia-smi -L | tee -a "$LOG"

# Libraries the GPU machine lacks, unpacked from carried .deb files.
D=$R/.device/root
shopt -s nullglob
debs=(.device/debs/*.deb)
if [ ${#debs[@]} -gt 0 ]; then
  rm -rf "$D"
  mkdir -p "$D"
  for f in "${debs[@]}"; do dpkg -x "$f" "$D"; done
  # prefix=/usr too (pcre2, openssl), not only paths spelled out (cjson)
  for pc in $(find "$D" -name '*.pc'); do
    sed -i -e "s#/usr/#$D/usr/#g" -e "s#^prefix=/usr\$#prefix=$D/usr#" "$pc"
  done
  export PKG_CONFIG_PATH=$D/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export CMAKE_PREFIX_PATH=$D/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
fi
shopt -u nullglob

# 1. Build.
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DSHARDTRAIN_CUDA=ON \
     -DSHARDTRAIN_WERROR=ON > "$O/cmake.txt" 2>&1 &&
   cmake --build build-gpu -j "$(nproc)" > "$O/build.txt" 2>&1; then
  ok build "build-gpu, CUDA on, -Werror"
else
  bad build "see $O/cmake.txt and $O/build.txt"
  grep -E -i "error" "$O/cmake.txt" "$O/build.txt" | head -20 | tee -a "$LOG"
  summary
fi
B=$R/build-gpu/shardtrain

# 2. The CUDA ctest, in the background while the runs below use the same
# GPU (one device call has 10 minutes; the ctest takes about two of them).
# Nothing below reads the device's free memory closely enough to mind (the
# budgets they test are given by --gpu-mem, far below the GPU's memory),
# and the checks compare results, never times. Its verdict comes last.
ctest_pid=
if [ -z "${SMOKE_SKIP_CTEST:-}" ]; then
  (cd build-gpu && timeout 420 ctest -R cuda --output-on-failure > "$O/ctest.txt" 2>&1
   echo $? > "$O/ctest.rc") &
  ctest_pid=$!
fi
ctest_verdict() {
  [ -n "$ctest_pid" ] || return 0
  wait "$ctest_pid"
  if [ "$(cat "$O/ctest.rc" 2>/dev/null)" = 0 ]; then
    ok ctest "$(grep -E 'tests passed|tests failed' "$O/ctest.txt" | tail -1)"
  else
    bad ctest "$(grep -E 'tests passed|tests failed|Failed|Timeout' "$O/ctest.txt" | tail -4 | tr '\n' ' ')"
  fi
}

DATA=data/kjv.h5
if [ ! -s "$DATA" ] && command -v bible >/dev/null; then
  mkdir -p data
  bible -f "gen1:1-rev22:21" > data/kjv.txt && "$B" prep --input data/kjv.txt --out "$DATA" > /dev/null
fi
if [ ! -s "$DATA" ]; then
  bad data "$DATA is missing: run scripts/demo.sh once (or carry data/ to this machine)"
  summary
fi

# Losses of a run's metrics.jsonl as "step loss" lines.
losses() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "step" in j and "loss" in j:
        print(j["step"], repr(j["loss"]))
PY
}

# check NAME STEPS CMD...: CMD exits 0, logs steps 1..STEPS with finite
# losses, and the last loss is below the first.
check() {
  local name=$1 steps=$2
  shift 2
  local t0
  t0=$(date +%s)
  "$@" > "$W/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -ne 0 ]; then
    bad "$name" "exit $rc after ${dt} s: $(grep -m1 -E 'error|Segmentation|Abort' "$W/$name.log")"
    return
  fi
  local verdict
  verdict=$(losses "$W/$name" 2>&1 | python3 -c '
import math, sys
steps = int(sys.argv[1])
rows = [l.split() for l in sys.stdin if l.strip()]
try:
    d = {int(s): float(v) for s, v in rows}
except ValueError:
    print("unreadable metrics: " + " ".join(" ".join(r) for r in rows)[:200]); sys.exit()
if sorted(d) != list(range(1, steps + 1)):
    print(f"logged steps {sorted(d)[:5]}..., expected 1..{steps}"); sys.exit()
if not all(math.isfinite(v) for v in d.values()):
    print("non-finite loss"); sys.exit()
if not d[steps] < d[1]:
    print(f"loss did not fall: {d[1]:.4f} -> {d[steps]:.4f}"); sys.exit()
print(f"ok loss {d[1]:.4f} -> {d[steps]:.4f}")
' "$steps")
  case "$verdict" in
    ok*) ok "$name" "${verdict#ok } in ${dt} s" ;;
    *) bad "$name" "$verdict" ;;
  esac
}

# refuse NAME CODE CMD...: CMD exits CODE with one "shardtrain: error" line.
refuse() {
  local name=$1 code=$2
  shift 2
  "$@" > "$W/$name.log" 2>&1
  local rc=$?
  local n
  n=$(grep -c "shardtrain: error" "$W/$name.log")
  if [ $rc -eq "$code" ] && [ "$n" -ge 1 ]; then
    ok "$name" "exit $rc: $(grep -m1 'shardtrain: error' "$W/$name.log" | cut -c1-110)"
  else
    bad "$name" "exit $rc (expected $code), $n error line(s)"
  fi
}

TINY=(--data "$DATA" --model tiny --seq-len 64 --micro-batch 4 --global-batch 8 --steps 12
      --lr 2e-3 --warmup 2 --val-every 6 --val-seqs 16 --log-every 1 --device cuda)

# 3. The matrix at the tiny shape.
for p in bf16 fp16 fp32; do
  for a in cudnn mixed flash; do
    for z in 0 1 2; do
      name=tiny-$p-$a-z$z
      if [ $p = fp32 ] && [ $a != flash ]; then
        [ $z = 0 ] && refuse "$name" 2 "$B" train "${TINY[@]}" --precision $p --attention $a \
          --zero $z --resume none --out "$W/$name"
        continue
      fi
      check "$name" 12 "$B" train "${TINY[@]}" --precision $p --attention $a --zero $z \
        --resume none --out "$W/$name"
    done
  done
done
for spec in "bf16 cudnn 1 selective" "bf16 flash 2 full" "fp16 cudnn 0 full" \
            "fp16 flash 1 selective" "fp32 flash 2 selective" "fp32 flash 0 full" \
            "bf16 cudnn 1 act" "fp16 flash 1 act"; do
  set -- $spec
  name=tiny-$1-$2-z$3-$4
  check "$name" 12 "$B" train "${TINY[@]}" --precision $1 --attention $2 --zero $3 \
    --recompute $4 --resume none --out "$W/$name"
done
# Two runs' losses, every one identical (NAME RUN_A RUN_B, runs under $W).
same_losses() {
  if [ -s "$W/$2/metrics.jsonl" ] && [ -s "$W/$3/metrics.jsonl" ] &&
     [ "$(losses "$W/$2")" = "$(losses "$W/$3")" ]; then
    ok "$1" "losses identical"
  else
    bad "$1" "$2's losses differ from $3's"
  fi
}
# Full recompute reruns each block up to its down projection with the same
# kernels as the forward: every loss identical to --recompute none's.
for run in bf16-flash-z2 fp16-cudnn-z0 fp32-flash-z0; do
  same_losses "tiny-$run-full-equals-none" "tiny-$run-full" "tiny-$run"
done
# act rebuilds only the MLP activation, from the same stored fc output and
# with the same unfused GELU/SwiGLU as selective's forward and recompute:
# every loss identical to selective's.
for run in bf16-cudnn-z1 fp16-flash-z1; do
  same_losses "tiny-$run-act-equals-selective" "tiny-$run-act" "tiny-$run-selective"
done

# The GPU-only diagnostics: a timeline of steps 3-4, memory samples every 2 steps.
name=tiny-timeline-gpustats
ST_TIMELINE=3:4 check "$name" 12 "$B" train "${TINY[@]}" --precision bf16 --gpu-stats-every 2 \
  --resume none --out "$W/$name"
if [ "$(grep -c '^timeline rank 0 step' "$W/$name.log")" -eq 2 ] &&
   grep -q -E '"(gpu|cuda)_mem_used_bytes"' "$W/$name/metrics.jsonl"; then
  ok "$name-output" "2 timeline lines on stderr, GPU samples in metrics.jsonl"
else
  bad "$name-output" "expected 2 'timeline rank 0 step' lines and GPU samples in metrics.jsonl"
fi

# gpt2-124m at T=1024 with GPT-2's vocabulary (the byte tokens fit in it).
G124=(--data "$DATA" --model gpt2-124m --vocab-size 50257 --seq-len 1024 --micro-batch 8
      --global-batch 8 --steps 6 --lr 6e-4 --warmup 2 --val-every 3 --val-seqs 8 --device cuda)
for spec in "bf16 cudnn 1 none" "bf16 flash 2 selective" "fp16 cudnn 0 full" "fp16 flash 2 none" \
            "fp32 flash 1 none" "bf16 cudnn 2 act"; do
  set -- $spec
  name=gpt2-124m-$1-$2-z$3-$4
  check "$name" 6 "$B" train "${G124[@]}" --precision $1 --attention $2 --zero $3 \
    --recompute $4 --resume none --out "$W/$name"
done

# The default GEMM search (kernels/cuda/matmul.cu, exact) keeps only
# algorithms whose output is bit for bit the heuristic's first's, so its
# losses equal those of no search at all; ST_GEMM_SEARCH=exact makes it say
# per problem how many of the candidates agreed. Two micro-batches a step,
# so the weight gradients, timed while zero, later add into nonzero ones.
for mode in off exact; do
  ST_GEMM_SEARCH=$mode check "gemm-$mode" 6 "$B" train "${G124[@]}" --precision bf16 \
    --global-batch 16 --resume none --out "$W/gemm-$mode"
done
ne=$(grep -c '^gemm search (exact).*bit-identical' "$W/gemm-exact.log")
if [ "$ne" -ge 1 ] && [ -s "$W/gemm-off/metrics.jsonl" ] &&
   [ "$(losses "$W/gemm-off")" = "$(losses "$W/gemm-exact")" ]; then
  ok gemm-search-exact "$ne problems timed; losses identical to no search"
else
  bad gemm-search-exact "$ne problems timed, or the losses differ from ST_GEMM_SEARCH=off's"
fi
grep '^gemm search' "$W/gemm-exact.log" >> "$LOG"

# ST_GEMM_SEARCH with ST_GEMM_CACHE (kernels/cuda/matmul.cu): the first run
# times 8 algorithms per GEMM problem and appends one line per choice; the
# second reads them, times nothing, and its losses are bit-identical.
GC=$W/gemm-cache.txt
rm -f "$GC"
for i in 1 2; do
  ST_GEMM_SEARCH=8 ST_GEMM_CACHE=$GC check "gemm-search-$i" 6 "$B" train "${G124[@]}" \
    --precision bf16 --resume none --out "$W/gemm-search-$i"
done
n1=$(grep -c '^gemm search' "$W/gemm-search-1.log")
n2=$(grep -c '^gemm search' "$W/gemm-search-2.log")
lines=$(wc -l < "$GC" 2>/dev/null || echo 0)
if [ "$n1" -ge 1 ] && [ "$n2" -eq 0 ] && [ "$lines" -eq "$n1" ] &&
   [ -s "$W/gemm-search-1/metrics.jsonl" ] &&
   [ "$(losses "$W/gemm-search-1")" = "$(losses "$W/gemm-search-2")" ]; then
  ok gemm-search-cache "$n1 problems timed and cached, the second run timed none, losses identical"
else
  bad gemm-search-cache "timed $n1 then $n2 problems, $lines cache lines, or the losses differ"
fi

# --attention auto at head size 64 on Hopper runs cuDNN's forward with our
# backward from the start (st_attention_auto_mixed): the GPT-2 124M runs
# above asked for nothing and got it.
if grep -q "(--attention auto; at head size 64 on Hopper our backward is faster" \
     "$W/gemm-search-1.log"; then
  ok attn-auto-64 "auto at GPT-2 124M's head size 64 ran mixed, and said why"
else
  bad attn-auto-64 "gemm-search-1.log (--attention auto, head size 64) does not say mixed ran"
fi

# --attention auto where cuDNN's backward is the faster (head size 128:
# GPT-2 124M's width in 6 heads) under a budget with room for half of
# cuDNN's whole workspace and 16 MiB (memory_fit.c,
# st_plan_attention_groups): the backward runs 8 sequences a call instead
# of 16, and the losses are those of one call for all 16 (--attention
# cudnn), bit for bit. T = 2048 so that 8 sequences make a call auto takes
# (st_attention_cudnn_min_group). The budget comes from the whole run's own
# plan (the first line of its metrics.jsonl), which `plan` cannot give:
# train plans for --val-seqs 0, plan for validation.
G16=(--data "$DATA" --model gpt2-124m --heads 6 --vocab-size 50257 --seq-len 2048 --micro-batch 16
     --global-batch 16 --steps 4 --lr 6e-4 --warmup 2 --val-seqs 0 --device cuda --precision bf16)
check attn-whole 4 "$B" train "${G16[@]}" --attention cudnn --resume none --out "$W/attn-whole"
budget=$(python3 - "$W/attn-whole/metrics.jsonl" <<'PY' 2>/dev/null
import json, sys
b = json.loads(open(sys.argv[1]).readline())["memory_plan"]["bytes"]
print(int((b["total"] - b["cudnn_attention_workspace"] // 2 + (16 << 20)) / 0.95) // 1024)
PY
)
check attn-groups 4 "$B" train "${G16[@]}" --attention auto --gpu-mem "${budget:-0}KiB" \
  --resume none --out "$W/attn-groups"
if grep -q "in groups of 8 sequences" "$W/attn-groups.log" &&
   [ -s "$W/attn-whole/metrics.jsonl" ] &&
   [ "$(losses "$W/attn-whole")" = "$(losses "$W/attn-groups")" ]; then
  ok attn-groups-equal "auto at --gpu-mem ${budget}KiB ran 8 sequences a call, losses identical"
else
  bad attn-groups-equal "no 'in groups of 8 sequences' in attn-groups.log, or the losses differ"
fi
# A budget with room for 4 sequences' workspace, below auto's smallest group
# here (8: st_attention_cudnn_min_group): cuDNN's forward runs with our
# backward, and the losses are those of --attention mixed, bit for bit.
budget4=$(python3 - "$W/attn-whole/metrics.jsonl" <<'PY' 2>/dev/null
import json, sys
b = json.loads(open(sys.argv[1]).readline())["memory_plan"]["bytes"]
print(int((b["total"] - b["cudnn_attention_workspace"] * 3 // 4 + (16 << 20)) / 0.95) // 1024)
PY
)
check attn-mixed 4 "$B" train "${G16[@]}" --attention mixed --resume none --out "$W/attn-mixed"
check attn-auto-mixed 4 "$B" train "${G16[@]}" --attention auto --gpu-mem "${budget4:-0}KiB" \
  --resume none --out "$W/attn-auto-mixed"
if grep -q "attention auto: cuDNN's deterministic backward needs" "$W/attn-auto-mixed.log" &&
   grep -q "fused flash attention forward" "$W/attn-auto-mixed.log" &&
   [ -s "$W/attn-mixed/metrics.jsonl" ] &&
   [ "$(losses "$W/attn-mixed")" = "$(losses "$W/attn-auto-mixed")" ]; then
  ok attn-auto-mixed-equal "auto at --gpu-mem ${budget4}KiB ran cuDNN's forward and ours' backward, losses identical to mixed's"
else
  bad attn-auto-mixed-equal "auto did not say it fell back to mixed, or the losses differ from mixed's"
fi
# mixed against ours both ways: the same model to bf16 rounding (the
# forward's kernels differ), every loss within 1%
if [ -s "$W/attn-mixed/metrics.jsonl" ] &&
   python3 - "$(losses "$W/attn-mixed")" "$(losses "$W/attn-whole")" <<'PY'
import sys
a, b = ([float(w.split()[1]) for w in x.splitlines()] for x in sys.argv[1:3])
sys.exit(0 if a and len(a) == len(b) and all(abs(x - y) <= 0.01 * abs(y) for x, y in zip(a, b)) else 1)
PY
then
  ok attn-mixed-close "mixed's losses within 1% of cuDNN's both ways"
else
  bad attn-mixed-close "mixed's losses are not within 1% of --attention cudnn's"
fi

# ZeRO 3 on one GPU: the block gathers and the head's, bit-identical losses
# to ZeRO 2 (the same reduction order), and with the optimizer offloaded.
for p in bf16 fp16; do
  check "tiny-$p-flash-z3" 12 "$B" train "${TINY[@]}" --precision $p --attention flash --zero 3 \
    --resume none --out "$W/tiny-$p-flash-z3"
  if [ -s "$W/tiny-$p-flash-z3/metrics.jsonl" ] && [ -s "$W/tiny-$p-flash-z2/metrics.jsonl" ] &&
     [ "$(losses "$W/tiny-$p-flash-z3")" = "$(losses "$W/tiny-$p-flash-z2")" ]; then
    ok "tiny-$p-z3-equals-z2" "12 losses identical"
  else
    bad "tiny-$p-z3-equals-z2" "ZeRO 3's losses differ from ZeRO 2's"
  fi
done
check gpt2-124m-bf16-cudnn-z3-offload 6 "$B" train "${G124[@]}" --precision bf16 --attention cudnn \
  --zero 3 --offload optimizer --resume none --out "$W/gpt2-124m-bf16-cudnn-z3-offload"

# One GPU makes no NCCL communicator (collectives/collectives_local.c): its
# collectives are copies, and the losses equal those of the same runs with
# NCCL over one rank (ST_NCCL_ONE_RANK=1), bit for bit, at ZeRO 1, 2 and 3.
for z in 1 2 3; do
  ST_NCCL_ONE_RANK=1 check "tiny-bf16-flash-z$z-nccl" 12 "$B" train "${TINY[@]}" --precision bf16 \
    --attention flash --zero $z --resume none --out "$W/tiny-bf16-flash-z$z-nccl"
  if grep -q "one rank, so no NCCL communicator" "$W/tiny-bf16-flash-z$z.log" &&
     grep -q "nccl       NCCL " "$W/tiny-bf16-flash-z$z-nccl.log" &&
     [ -s "$W/tiny-bf16-flash-z$z/metrics.jsonl" ] &&
     [ "$(losses "$W/tiny-bf16-flash-z$z")" = "$(losses "$W/tiny-bf16-flash-z$z-nccl")" ]; then
    ok "tiny-z$z-copies-equal-nccl" "12 losses identical, no communicator without ST_NCCL_ONE_RANK"
  else
    bad "tiny-z$z-copies-equal-nccl" "the config lines do not say which ran, or the losses differ"
  fi
done

# The bf16 master split in two halves (kernels/master_split.h) against an
# fp32 master copy (ST_MASTER_FP32=1): 12 losses within 1e-3 relative (the
# working weights differ only where a master sits on an exact tie) and the
# plan's master bytes halved. Section 4's bit-exact resume runs bf16, so
# split: the halves joined into the checkpoint's fp32 master and split again.
ST_MASTER_FP32=1 check tiny-bf16-flash-z0-fp32master 12 "$B" train "${TINY[@]}" --precision bf16 \
  --attention flash --zero 0 --resume none --out "$W/tiny-bf16-flash-z0-fp32master"
check tiny-bf16-flash-z0-split 12 "$B" train "${TINY[@]}" --precision bf16 \
  --attention flash --zero 0 --resume none --out "$W/tiny-bf16-flash-z0-split"
verdict=$(python3 - "$W/tiny-bf16-flash-z0-split" "$W/tiny-bf16-flash-z0-fp32master" <<'PY'
import json, sys
def run(d):
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    plan = rows[0]["memory_plan"]["bytes"]
    return [r["loss"] for r in rows if "loss" in r and "step" in r], plan
(a, pa), (b, pb) = run(sys.argv[1]), run(sys.argv[2])
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
ok = len(a) == len(b) == 12 and worst < 1e-3 and 2 * pa["master"] <= pb["master"] + 512
print(("ok" if ok else "bad") + f" {len(a)} losses, largest relative gap {worst:.2e}, master "
      f"{pa['master']} against {pb['master']} bytes")
PY
)
if [ "${verdict%% *}" = ok ]; then ok master-split-vs-fp32 "${verdict#* }"
else bad master-split-vs-fp32 "${verdict:-no verdict (a run failed)}"; fi
# The checkpoint says how its master was kept; resuming the split run with
# ST_MASTER_FP32=1 continues and says the resume is not bit-exact.
said=no
python3 -c 'import h5py, json, sys; f = h5py.File(sys.argv[1], "r"); sys.exit(json.loads(f.attrs["config"])["train"].get("master") != "split")' \
  "$W/tiny-bf16-flash-z0-split/ckpt/step_00000012/index.h5" 2>/dev/null && said=yes
ST_MASTER_FP32=1 "$B" train "${TINY[@]}" --precision bf16 --attention flash --zero 0 --steps 14 \
  --resume auto --out "$W/tiny-bf16-flash-z0-split" > "$W/master-mode-resume.log" 2>&1
if [ $said = yes ] &&
   grep -q "kept the bf16 master split, this one keeps it whole" "$W/master-mode-resume.log" &&
   grep -q "^done: step 14" "$W/master-mode-resume.log"; then
  ok master-mode-resume "the checkpoint's config says split; resumed whole, to step 14, with the notice"
else
  bad master-mode-resume "config says split: $said; no notice, or the resume failed"
fi

# One micro-step a step (global batch = micro-batch): ZeRO 2 and 3 reduce
# straight into the gradient shard, no receive buffers, and sum as ZeRO 1
# does: the same 12 losses, bit for bit, with the split master.
for z in 1 2 3; do
  check "tiny-bf16-acc1-z$z" 12 "$B" train "${TINY[@]}" --global-batch 4 --precision bf16 \
    --attention flash --zero $z --resume none --out "$W/tiny-bf16-acc1-z$z"
done
if [ -s "$W/tiny-bf16-acc1-z1/metrics.jsonl" ] &&
   [ "$(losses "$W/tiny-bf16-acc1-z1")" = "$(losses "$W/tiny-bf16-acc1-z2")" ] &&
   [ "$(losses "$W/tiny-bf16-acc1-z1")" = "$(losses "$W/tiny-bf16-acc1-z3")" ] &&
   python3 -c 'import json,sys; b=json.loads(open(sys.argv[1]).readline())["memory_plan"]["bytes"]; sys.exit(b["grads_recv"] != 0)' "$W/tiny-bf16-acc1-z2/metrics.jsonl"; then
  ok acc1-zero-stages-equal "ZeRO 1, 2 and 3 at one micro-step: 12 losses identical, no receive buffers planned"
else
  bad acc1-zero-stages-equal "the losses differ between ZeRO 1, 2 and 3, or ZeRO 2 planned receive buffers"
fi

# --grad-dtype bf16 (the reduced gradient shard in bf16): step 1's gradients
# (as computed: ST_TEST_GRAD_RAW) are the fp32 run's rounded to nearest even
# bit for bit; ZeRO 2 and 3 give the same 12 losses; the plan's shard is 2
# bytes a parameter; the losses stay within 1e-2 of fp32 gradients'.
for v in z2-fp32 z2-bf16 z3-bf16; do
  mkdir -p "$W/grad16-$v-raw"
  ST_TEST_GRAD_RAW="$W/grad16-$v-raw" check "tiny-grad16-$v" 12 "$B" train "${TINY[@]}" \
    --global-batch 4 --precision bf16 --attention flash --zero "${v:1:1}" --grad-dtype "${v#*-}" \
    --resume none --dump-grads 1 --out "$W/tiny-grad16-$v"
done
verdict=$(python3 - "$W" <<'PY'
import json, os, sys
import numpy as np
w = sys.argv[1]
raw = lambda v: np.fromfile(f"{w}/grad16-{v}-raw/step_1_rank_0.f32", dtype=np.float32)
g32, g16 = raw("z2-fp32"), raw("z2-bf16")
u = g32.view(np.uint32).astype(np.uint64)
want = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
if g16.size == 0 or not np.array_equal(g16.view(np.uint32), want):
    print("step 1's bf16 gradients are not the fp32 ones rounded"); sys.exit()
def losses(v):
    rows = [json.loads(l) for l in open(f"{w}/tiny-grad16-{v}/metrics.jsonl")]
    return [r["loss"] for r in rows if "loss" in r and "step" in r]
a, b, c = losses("z2-bf16"), losses("z3-bf16"), losses("z2-fp32")
if len(a) != 12 or a != b:
    print("ZeRO 2 and 3 with bf16 gradients differ"); sys.exit()
d = max(abs(x - y) for x, y in zip(a, c))
if d > 1e-2:
    print(f"bf16 gradients move the losses by {d:.3g} from fp32's"); sys.exit()
plan = json.loads(open(f"{w}/tiny-grad16-z2-bf16/metrics.jsonl").readline())["memory_plan"]
ref = json.loads(open(f"{w}/tiny-grad16-z2-fp32/metrics.jsonl").readline())["memory_plan"]
s16, s32 = plan["bytes"]["grad_shard"], ref["bytes"]["grad_shard"]
if s16 != (s32 // 2 + 255) // 256 * 256:
    print(f"the planned bf16 shard is {s16} bytes against fp32's {s32}"); sys.exit()
print(f"ok step 1 = fp32 rounded ({g16.size} values), ZeRO 2 = 3 over 12 losses, "
      f"max |loss - fp32's| {d:.2g}, shard {s16} against {s32} bytes")
PY
)
if [ "${verdict%% *}" = ok ]; then ok grad-bf16 "${verdict#ok }"
else bad grad-bf16 "${verdict:-no verdict (a run failed)}"; fi

# Asynchronous checkpoints (the default) against --ckpt-async off on the GPU:
# every dataset of every checkpoint equal; gradient dumps of CUDA fp32 within
# 1e-4 (relative, per tensor) of the CPU's.
for m in on off; do
  "$B" train "${TINY[@]}" --steps 6 --precision bf16 --ckpt-every 2 --ckpt-async $m \
    --dump-grads 3 --resume none --out "$W/ckpt-async-$m" > "$W/ckpt-async-$m.log" 2>&1
done
verdict=$(python3 - "$W/ckpt-async-on" "$W/ckpt-async-off" <<'PY'
import os, sys
import h5py, numpy as np
a, b = sys.argv[1:]
n = 0
for s in (2, 4, 6):
    fa = h5py.File(f"{a}/ckpt/step_{s:08d}/index.h5", "r")
    fb = h5py.File(f"{b}/ckpt/step_{s:08d}/index.h5", "r")
    for g in ("params", "adam_m", "adam_v"):
        for k in fa[g]:
            if not np.array_equal(fa[g][k][...], fb[g][k][...]):
                print(f"step {s} {g}/{k} differs"); sys.exit()
            n += 1
print(f"ok {n} datasets equal")
PY
)
case "$verdict" in ok*) ok ckpt-async-equals-sync "${verdict#ok }" ;; *) bad ckpt-async-equals-sync "$verdict" ;; esac
for d in cuda cpu; do
  "$B" train --data "$DATA" --model tiny --seq-len 64 --micro-batch 4 --global-batch 8 --steps 2 \
    --precision fp32 --device $d --dump-grads 1 --resume none --out "$W/grads-$d" > "$W/grads-$d.log" 2>&1
done
if "$B" grads diff "$W/grads-cuda" "$W/grads-cpu" --tol 1e-4 > "$W/grads-diff.log" 2>&1; then
  ok grads-cuda-vs-cpu "$(grep 'largest difference' "$W/grads-diff.log" | cut -c1-110)"
else
  bad grads-cuda-vs-cpu "$(tail -1 "$W/grads-diff.log" | cut -c1-160)"
fi

# sample and eval on CUDA against the CPU, from a tiny run trained above:
# greedy ids in fp32 equal the CPU's (KV cache on both), eval's loss within
# 1e-5 relative in fp32 and 2e-2 in bf16; sample runs in bf16.
# sample_eval RUN NAME NOTE: greedy ids of RUN's checkpoint on the CPU, on
# CUDA fp32 (equal) and bf16 (it runs), and eval loss on each (fp32 within
# 1e-5 of the CPU, bf16 within 2e-2).
sample_eval() {
  local run=$1 name=$2 note=$3
  local ids=(--prompt-ids 73,110,32,116,104,101 --max-new 40 --temperature 0 --print-ids)
  local c g b
  c=$("$B" sample --init "$run" --device cpu "${ids[@]}" 2>> "$W/$name.log")
  g=$("$B" sample --init "$run" --device cuda --precision fp32 "${ids[@]}" 2>> "$W/$name.log")
  b=$("$B" sample --init "$run" --device cuda --precision bf16 "${ids[@]}" 2>> "$W/$name.log")
  if [ -z "$c" ] || [ "$c" != "$g" ] || [ -z "$b" ]; then
    bad "$name" "greedy ids: cpu '$c' cuda fp32 '$g' bf16 '$b' (see $W/$name.log)"; return
  fi
  local verdict
  verdict=$(for d in "cpu fp32" "cuda fp32" "cuda bf16"; do
      set -- $d
      "$B" eval --init "$run" --data "$DATA" --max-windows 64 --device $1 --precision $2 --json
    done 2>> "$W/$name.log" | python3 -c '
import json, sys
c, f, b = (json.loads(l)["loss"] for l in sys.stdin)
ok = abs(f - c) <= 1e-5 * c and abs(b - c) <= 2e-2 * c
print(("ok " if ok else "") + f"eval loss cpu {c:.6f}, cuda fp32 {f:.6f}, bf16 {b:.6f}")' 2>&1)
  case "$verdict" in
    ok*) ok "$name" "40 greedy ids equal the CPU's$note; ${verdict#ok }" ;;
    *) bad "$name" "$verdict" ;;
  esac
}
sample_eval "$W/tiny-fp32-flash-z0" sample-eval-cuda ""

# An imported Hugging Face GPT-2 on CUDA (tests/data/hf/tiny, whose outputs
# transformers wrote into oracle.json): greedy ids in fp32 equal
# generate(do_sample=False)'s, eval's loss equals transformers' within 1e-5
# relative (fp32) and 2e-2 (bf16), and train --init-from it runs in bf16
# with its first loss equal (2e-2) to eval's on the same weights.
hf_import_cuda() {
  local name=hf-import-cuda hf=$R/tests/data/hf
  local log=$W/$name.log
  local verdict
  verdict=$(python3 - "$B" "$hf" "$W/$name" 2>&1 <<'PY'
import json, subprocess, sys
b, hf, work = sys.argv[1:]
o = json.load(open(f"{hf}/oracle/oracle.json"))
def sh(*a):
    r = subprocess.run([str(x) for x in a], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"exit {r.returncode}: {' '.join(map(str, a))}: {r.stderr.strip()[-300:]}")
    return r.stdout
ids = sh(b, "sample", "--init", f"{hf}/tiny", "--device", "cuda", "--precision", "fp32",
         "--temperature", 0, "--max-new", 20, "--print-ids",
         "--prompt-ids", ",".join(map(str, o["prompt"])))
got = [int(x) for x in ids.strip().split(",")]
if got != o["greedy_20"]:
    sys.exit(f"greedy ids {got} != transformers' {o['greedy_20']}")
msg = []
for prec, tol in (("fp32", 1e-5), ("bf16", 2e-2)):
    for t in ("16", "32"):
        e = json.loads(sh(b, "eval", "--init", f"{hf}/tiny", "--data", f"{hf}/oracle/eval_tokens.bin",
                          "--seq-len", t, "--device", "cuda", "--precision", prec, "--json"))
        ref = o["eval_mean_loss_by_seq_len"][t]["loss"]
        if abs(e["loss"] - ref) > tol * ref:
            sys.exit(f"eval {prec} T={t}: {e['loss']} vs transformers' {ref}")
        msg.append(f"{prec} T={t} {abs(e['loss'] - ref) / ref:.1e}")
sh(b, "train", "--init-from", f"{hf}/tiny", "--data", f"{hf}/oracle/eval_tokens.bin",
   "--seq-len", 16, "--micro-batch", 4, "--global-batch", 4, "--steps", 3, "--device", "cuda",
   "--precision", "bf16", "--out", work, "--resume", "none", "--val-every", 0)
first = [json.loads(l) for l in open(f"{work}/metrics.jsonl") if '"loss"' in l][0]["loss"]
print(f"ok 20 greedy ids equal transformers'; eval rel. diff {', '.join(msg)}; "
      f"--init-from bf16 step-1 loss {first:.4f}")
PY
)
  echo "$verdict" >> "$log"
  case "$verdict" in
    ok*) ok "$name" "${verdict#ok }" ;;
    *) bad "$name" "$(echo "$verdict" | tail -1)" ;;
  esac
}
hf_import_cuda

# The Llama family: llama-tiny imported from Hugging Face (GQA 4/2, RoPE with
# Llama 3 scaling, SwiGLU, untied head; byte tokens fit its 300-token
# vocabulary) across precision x attention x ZeRO, a wider GQA Llama (cuDNN, ours
# and mixed: cuDNN's GQA forward feeding our GQA backward) and an
# MQA Qwen2 (q/k/v biases) from flags; then greedy ids and eval on CUDA
# against the CPU for the imported family model.
LT=$R/tests/data/hf/llama-tiny
FAM=(--data "$DATA" --init-from "$LT" --seq-len 64 --micro-batch 4 --global-batch 8 --steps 12
     --lr 2e-3 --warmup 2 --val-every 6 --val-seqs 16 --log-every 1 --device cuda)
for spec in "bf16 cudnn 0 none" "bf16 flash 1 selective" "bf16 cudnn 2 full" \
            "fp16 flash 2 selective" "fp32 flash 0 none" "bf16 flash 1 act"; do
  set -- $spec
  name=llama-tiny-$1-$2-z$3-$4
  check "$name" 12 "$B" train "${FAM[@]}" --precision $1 --attention $2 --zero $3 \
    --recompute $4 --resume none --out "$W/$name"
done
same_losses llama-tiny-bf16-flash-z1-act-equals-selective llama-tiny-bf16-flash-z1-act \
  llama-tiny-bf16-flash-z1-selective
LW=(--data "$DATA" --arch llama --layers 4 --heads 8 --kv-heads 2 --dim 512 --ffn-dim 1376
    --tied 0 --seq-len 256 --micro-batch 8 --global-batch 8 --steps 8 --lr 1e-3 --warmup 2
    --val-every 4 --val-seqs 8 --log-every 1 --device cuda)
for spec in "llama bf16 cudnn" "llama fp16 flash" "llama bf16 mixed"; do
  set -- $spec
  check "wide-$1-$2-$3" 8 "$B" train "${LW[@]}" --precision $2 --attention $3 --zero 1 \
    --resume none --out "$W/wide-$1-$2-$3"
done
check "qwen2-mqa-bf16-cudnn" 8 "$B" train "${LW[@]}" --arch qwen2 --kv-heads 1 --tied 1 \
  --precision bf16 --attention cudnn --zero 2 --resume none --out "$W/qwen2-mqa-bf16-cudnn"
sample_eval "$W/llama-tiny-fp32-flash-z0-none" llama-sample-eval-cuda " (RoPE, GQA decode)"

# LoRA on the imported llama-tiny (docs/lora.md): the frozen base's
# input-only backward and the adapter ops on CUDA, every target, dropout on,
# ZeRO 0-2 and each recompute policy; a bit-exact resume follows in 4.
LORA=(--data "$DATA" --init-from "$LT" --lora 8,alpha=16,dropout=0.1,targets=q,k,v,o,gate,up,down
      --seq-len 64 --micro-batch 4 --global-batch 8 --steps 12 --lr 1e-2 --warmup 2
      --val-every 6 --val-seqs 16 --log-every 1 --device cuda)
for spec in "bf16 cudnn 1 none" "bf16 flash 2 full" "fp16 cudnn 0 selective" "fp32 flash 2 none" \
            "bf16 flash 1 act"; do
  set -- $spec
  name=lora-llama-tiny-$1-$2-z$3-$4
  check "$name" 12 "$B" train "${LORA[@]}" --precision $1 --attention $2 --zero $3 \
    --recompute $4 --resume none --out "$W/$name"
done
# QLoRA: the same with the base's projections in NF4 (docs/nf4.md), dequantised before each GEMM.
for spec in "bf16 cudnn 1 none" "bf16 flash 2 full" "fp32 flash 0 selective"; do
  set -- $spec
  name=qlora-llama-tiny-$1-$2-z$3-$4
  check "$name" 12 "$B" train "${LORA[@]}" --base-dtype nf4 --precision $1 --attention $2 \
    --zero $3 --recompute $4 --resume none --out "$W/$name"
done

# 4. Stop, resume, verify: the resumed run's losses equal an uninterrupted
# run's, bit for bit (deterministic kernels, restored data position and RNG).
resume_case() {
  local name=$1 steps=$2 stop=$3
  shift 3
  local ref=$W/$name-ref run=$W/$name
  "$B" train "$@" --steps "$steps" --ckpt-every "$stop" --resume none --out "$ref" \
    > "$ref.log" 2>&1 ||
    { bad "$name" "uninterrupted run failed: $(grep -m1 error "$ref.log")"; return; }
  "$B" train "$@" --steps "$steps" --ckpt-every "$stop" --stop-after "$stop" --resume none \
    --out "$run" > "$run.leg1.log" 2>&1 ||
    { bad "$name" "first leg failed: $(grep -m1 error "$run.leg1.log")"; return; }
  "$B" train "$@" --steps "$steps" --ckpt-every "$stop" --resume auto --out "$run" \
    > "$run.leg2.log" 2>&1 ||
    { bad "$name" "resume failed: $(grep -m1 error "$run.leg2.log")"; return; }
  if ! grep -q "resumed from" "$run.leg2.log"; then
    bad "$name" "the second leg did not say it resumed"; return
  fi
  local a b
  a=$(losses "$ref" | awk -v s="$stop" '$1 > s')
  b=$(losses "$run" | awk -v s="$stop" '$1 > s')
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    bad "$name" "resumed losses differ from the uninterrupted run's: $(diff <(echo "$a") <(echo "$b") | head -4 | tr '\n' ' ')"
    return
  fi
  if "$B" ckpt verify "$run" > "$run.verify.log" 2>&1; then
    ok "$name" "steps $((stop + 1))-$steps identical after resume, ckpt verify OK"
  else
    bad "$name" "ckpt verify: $(head -c 200 "$run.verify.log")"
  fi
}
resume_case resume-tiny-bf16-cudnn-z1 12 6 "${TINY[@]}" --precision bf16 --attention cudnn --zero 1
resume_case resume-tiny-fp32-flash-z2 12 6 "${TINY[@]}" --precision fp32 --attention flash --zero 2
resume_case resume-gpt2-124m-bf16-z1 6 3 "${G124[@]}" --precision bf16 --attention cudnn --zero 1
resume_case resume-llama-wide-bf16-z2 8 4 "${LW[@]}" --precision bf16 --attention cudnn --zero 2
resume_case resume-lora-llama-tiny-bf16-z2 12 6 "${LORA[@]}" --precision bf16 --attention cudnn --zero 2
resume_case resume-qlora-llama-tiny-bf16-z1 12 6 "${LORA[@]}" --base-dtype nf4 --precision bf16 --attention cudnn --zero 1
ctest_verdict
summary
