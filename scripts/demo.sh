#!/usr/bin/env bash
# The main job on real data: install dependencies, build, prepare the King
# James Bible (Debian's bible-kjv) as byte tokens, train the "small" GPT-2
# under mpirun -np 2 with ZeRO-1 into runs/demo/, stopping half way and
# resuming from the checkpoint, then verify the checkpoint.
# Idempotent: a second run reuses the data and resumes the finished run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh run
bash scripts/build.sh

BIN=build/shardtrain
mkdir -p data
if [ ! -s data/kjv.h5 ]; then
  bible -f "gen1:1-rev22:21" > data/kjv.txt
  $BIN prep --input data/kjv.txt --out data/kjv.h5 --val-fraction 0.1
else
  echo "prep: data/kjv.h5 exists, skipping"
fi

NP=${NP:-2}
STEPS=${STEPS:-1000}
MPIRUN=(mpirun -np "$NP" --bind-to none --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
# Two cores for two ranks: one OpenMP thread each unless the user says otherwise.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
TRAIN=("${MPIRUN[@]}" $BIN train --data data/kjv.h5 --out runs/demo --model small
       --seq-len 128 --micro-batch 16 --global-batch 32 --zero 1 --steps "$STEPS"
       --lr 2e-3 --warmup 50 --val-every 100 --log-every 25 --ckpt-every 100 --resume auto)

start=$(date +%s)
echo "== leg 1: train to step $((STEPS / 2)), then stop (as a preempted job would)"
"${TRAIN[@]}" --stop-after $((STEPS / 2))
echo "== leg 2 (leg 1 took $(( $(date +%s) - start )) s; this leg's step lines count their time from 0): resume from runs/demo/ckpt/latest and finish"
"${TRAIN[@]}"
end=$(date +%s)

# the verify summary without its one-line config JSON (ckpt info prints it)
$BIN ckpt verify runs/demo | grep -v '^  config '
/usr/bin/python3 - <<'PY'
import json, h5py, numpy as np
with h5py.File("data/kjv.h5") as f:
    tr = f["train"][...]
p = np.bincount(tr, minlength=256).astype(float)
p = p[p > 0] / p.sum()
h = -(p * np.log(p)).sum()
val = [json.loads(l)["val_loss"] for l in open("runs/demo/metrics.jsonl") if "val_loss" in l]
print(f"unigram entropy of the byte distribution: {h:.3f} nats/byte")
print(f"final validation loss (the run's first 256 validation windows, --val-seqs): {val[-1]:.3f} nats/byte")
PY
echo "wall time of both legs: $((end - start)) s; run directory: runs/demo"
echo "next: $BIN sample --init runs/demo --prompt \"And God said\" --max-new 80   (prints the continuation only; under a second)"
echo "      $BIN eval --init runs/demo --data data/kjv.h5 --seq-len 128   (every window of the validation split, about a minute, so its loss differs from the run's; --max-windows 256 gives the run's)"
