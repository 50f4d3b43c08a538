#!/bin/bash
# Training throughput against the rank count: weak scaling (micro-batch per
# rank fixed, global batch grows) and strong scaling (global batch fixed),
# each step split into data, compute, exposed communication and optimizer
# (`train --step-timing`, which synchronises the device at phase
# boundaries). A benchmark, not a test.
#
#   bash bench/train_scaling.sh OUT_DIR RANKS_LIST [train flags...]
#     RANKS_LIST  e.g. 1,2 (GPUs: one rank per GPU) or 1,2,4 (CPU ranks)
#     train flags: at least --data and the model; --micro-batch B (per rank)
#     and --steps; --device, --precision as for train.
# Env: MPIRUN (mpirun --allow-run-as-root --oversubscribe --bind-to none),
#      BIN (build/shardtrain), PEAK_TFLOPS (bf16 peak per GPU for MFU; none),
#      MODES ("weak strong"; one of them to halve the runs).
# Writes OUT_DIR/scaling.json and prints the tables; bench/plot_scaling.py
# draws them.
set -eu
OUT=${1:?usage: bench/train_scaling.sh OUT_DIR RANKS_LIST [train flags...]}
LIST=${2:?usage: bench/train_scaling.sh OUT_DIR RANKS_LIST [train flags...]}
shift 2
BIN=${BIN:-build/shardtrain}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none}
mkdir -p "$OUT"
MB=$(printf '%s\n' "$@" | awk 'p{print; exit} /^--micro-batch$/{p=1}')
MB=${MB:-8}
declare -a FLAGS=()
skip=0
for a in "$@"; do # drop --micro-batch/--global-batch: set per run below
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in --micro-batch|--global-batch|--out|--resume) skip=1 ;; *) FLAGS+=("$a") ;; esac
done
NMAX=$(echo "$LIST" | tr ',' '\n' | sort -n | tail -1)
MODES=${MODES:-weak strong}
for mode in $MODES; do
  for n in ${LIST//,/ }; do
    if [ $mode = weak ]; then mb=$MB; gb=$((MB * n)); else gb=$((MB * NMAX)); mb=$((gb / n)); fi
    d="$OUT/$mode-$n"; rm -rf "$d"
    $MPIRUN -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np $n $BIN train \
      "${FLAGS[@]}" --micro-batch $mb --global-batch $gb --out "$d" --resume none \
      --step-timing --val-seqs 0 > "$d.log" 2>&1 || { echo "run $mode n=$n failed: $d.log"; tail -3 "$d.log"; exit 1; }
  done
done
/usr/bin/python3 - "$OUT" "$LIST" "${PEAK_TFLOPS:-0}" "$MODES" <<'PY'
import json, os, re, statistics, sys
out, ranks, peak = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], float(sys.argv[3])
res = {m: [] for m in sys.argv[4].split()}
for mode in res:
    for n in ranks:
        d = os.path.join(out, f"{mode}-{n}")
        rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"t_step_ms"' in l]
        rows = rows[1:] or rows  # the first step warms caches and allocators
        plan = json.loads(open(os.path.join(d, "metrics.jsonl")).readline())["memory_plan"]
        P, C, L, T = (plan["model"][k] for k in ("params", "n_embd", "n_layer", "seq_len"))
        tok = plan["config"]["global_batch"] * T
        med = lambda k: statistics.median(r[k] for r in rows)
        tps = tok / (med("t_step_ms") / 1e3)
        tflops = (6 * P + 6 * L * C * T) * tps / n / 1e12
        res[mode].append({"ranks": n, "tokens_per_s": tps, "tflops_per_rank": tflops,
                          "mfu": tflops / peak if peak else None,
                          **{k: med(k) for k in ("t_step_ms", "t_data_ms", "t_compute_ms",
                                                 "t_comm_ms", "t_optimizer_ms")}})
    base = res[mode][0]
    for r in res[mode]:
        k = r["ranks"] / base["ranks"]
        r["efficiency"] = r["tokens_per_s"] / (k * base["tokens_per_s"])
json.dump(res, open(os.path.join(out, "scaling.json"), "w"), indent=1)
for mode, rows in res.items():
    print(f"{mode} scaling ({'micro-batch per rank fixed' if mode == 'weak' else 'global batch fixed'}), "
          "median step after the first; efficiency against the smallest rank count")
    print(f"{'ranks':>6} {'tokens/s':>12} {'TFLOP/s/rank':>13} {'MFU':>6} {'eff':>7} {'step ms':>9} "
          f"{'data':>7} {'compute':>9} {'comm':>7} {'optim':>7}")
    for r in rows:
        mfu = f"{100 * r['mfu']:5.1f}%" if r["mfu"] else "    -"
        print(f"{r['ranks']:>6} {r['tokens_per_s']:>12.0f} {r['tflops_per_rank']:>13.3f} {mfu:>6} "
              f"{100 * r['efficiency']:>6.1f}% {r['t_step_ms']:>9.2f} {r['t_data_ms']:>7.2f} "
              f"{r['t_compute_ms']:>9.2f} {r['t_comm_ms']:>7.2f} {r['t_optimizer_ms']:>7.2f}")
PY
