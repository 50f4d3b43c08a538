#!/bin/bash
# Peak device memory and tokens/s, shardtrain against the PyTorch peer, one
# row per shape and --recompute policy: bench/speed_vs_torch.sh with the
# memory matrix's defaults (12 steps, the median of those after the first
# 6; POLICIES, e.g. "none selective", runs ours once per policy against the
# one peer run). No activation checkpointing on the peer.
# A benchmark, not a test (docs/memory.md, "Against PyTorch").
#
#   bash bench/memory_vs_torch.sh PEER_DIR OUT.jsonl "MODEL:T:MB ..."
# Rows, arguments and the other environment variables: speed_vs_torch.sh.
set -u
# A missing argument: one usage line and exit 2 (speed_vs_torch.sh says why).
if [ $# -lt 3 ] || [ -z "$1" ] || [ -z "$2" ] || [ -z "$3" ]; then
  echo "usage: bench/memory_vs_torch.sh PEER_DIR OUT.jsonl \"MODEL:T:MB ...\"" >&2
  exit 2
fi
STEPS=${STEPS:-12} WARM=${WARM:-6} WORK=${WORK:-/tmp/st_mem_bench} \
  exec bash "$(dirname "$0")/speed_vs_torch.sh" "$@"
