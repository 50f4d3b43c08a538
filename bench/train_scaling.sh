#!/bin/bash
# Training throughput against the rank count, weak and strong: a thin wrapper
# kept for old command lines around `shardtrain bench train`, which does the
# work (runs, medians, tables, OUT_DIR/scaling.json; see its --help).
#
#   bash bench/train_scaling.sh OUT_DIR RANKS_LIST [train flags...]
# is
#   $BIN bench train --ranks RANKS_LIST --out OUT_DIR --launcher "$MPIRUN" \
#       [--peak-tflops $PEAK_TFLOPS] [--modes $MODES] -- [train flags...]
# Env: MPIRUN (mpirun --allow-run-as-root --oversubscribe --bind-to none),
#      BIN (build/shardtrain), PEAK_TFLOPS (peak TFLOP/s per GPU for MFU; none),
#      MODES ("weak strong"; one of them to halve the runs).
# Train flags as before, except that --out, --resume and --global-batch are
# refused rather than dropped (the command sets them per run).
set -eu
# A missing argument: one usage line and exit 2, the project's code for a
# bad argument.
if [ $# -lt 2 ] || [ -z "$1" ] || [ -z "$2" ]; then
  echo "usage: bench/train_scaling.sh OUT_DIR RANKS_LIST [train flags...]" >&2
  exit 2
fi
OUT=$1
LIST=$2
shift 2
BIN=${BIN:-build/shardtrain}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none}
MODES=${MODES:-weak strong}
PEAK=()
if [ -n "${PEAK_TFLOPS:-}" ] && [ "${PEAK_TFLOPS}" != 0 ]; then PEAK=(--peak-tflops "$PEAK_TFLOPS"); fi
exec "$BIN" bench train --ranks "$LIST" --out "$OUT" --launcher "$MPIRUN" \
  --modes "$(echo $MODES | tr ' ' ',')" "${PEAK[@]}" -- "$@"
