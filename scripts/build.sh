#!/usr/bin/env bash
# Configure and build into build/ (incremental on a second run).
# Warnings are errors under CI (CI=true) or with WERROR=1.
set -euo pipefail
cd "$(dirname "$0")/.."
werror=OFF
[ "${CI:-}" = "true" ] || [ "${WERROR:-0}" = "1" ] && werror=ON
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSHARDTRAIN_WERROR=$werror
fi
cmake --build build -j "$(nproc)"
