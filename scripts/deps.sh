#!/usr/bin/env bash
# Install the Debian packages shardtrain builds and tests with. Idempotent:
# does nothing when every package is already installed.
#   bash scripts/deps.sh        everything (the tests: scripts/test.sh)
#   bash scripts/deps.sh run    only what building and training need
#                               (scripts/demo.sh): no analyzer, Slurm or plots
set -euo pipefail

PKGS=(build-essential cmake pkg-config
      openmpi-bin libopenmpi-dev          # MPI: launcher and CPU collectives
      libhdf5-dev hdf5-tools              # checkpoints, token files (VDS, hl)
      libcjson-dev libcmocka-dev          # config JSON, unit tests
      libpcre2-dev libssl-dev             # tokenizer: pre-tokenization regex, vocabulary digest
      libicu-dev                          # tokenizer: NFC normalizer (optional to the build)
      python3 python3-h5py python3-numpy  # test oracles read HDF5 like a user would
      bible-kjv)                          # the shipped real corpus
case "${1:-}" in
  run) ;;
  "")
    PKGS+=(clang-tidy                     # static analysis (scripts/static_analysis.sh)
           python3-matplotlib             # benchmark plots (bench/plot_busbw.py)
           iproute2 util-linux            # network-namespace "two hosts" test
           slurmctld slurmd slurm-client munge libpmix-dev)  # real-Slurm preemption test
    ;;
  *) echo "usage: scripts/deps.sh [run]" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"
