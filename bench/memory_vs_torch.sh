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
: "${3:?usage: bench/memory_vs_torch.sh PEER_DIR OUT.jsonl \"MODEL:T:MB ...\"}"
STEPS=${STEPS:-12} WARM=${WARM:-6} WORK=${WORK:-/tmp/st_mem_bench} \
  exec bash "$(dirname "$0")/speed_vs_torch.sh" "$@"
