#!/usr/bin/env bash
# Configure and build into build/ (incremental on a second run).
# Warnings are errors under CI (CI=true) or with WERROR=1.
set -euo pipefail
cd "$(dirname "$0")/.."
werror=OFF
[ "${CI:-}" = "true" ] || [ "${WERROR:-0}" = "1" ] && werror=ON
# A build/ configured earlier without warnings-as-errors (demo.sh leaves
# one) is switched on here when CI asks, so CI=true never reuses a lax cache.
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSHARDTRAIN_WERROR=$werror
elif [ $werror = ON ] && ! grep -q '^SHARDTRAIN_WERROR:BOOL=ON' build/CMakeCache.txt; then
  echo "build.sh: build/ was configured without warnings-as-errors; reconfiguring it with them (CI=true or WERROR=1)"
  cmake -S . -B build -DSHARDTRAIN_WERROR=ON
fi
cmake --build build -j "$(nproc)"
