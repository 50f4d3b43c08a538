#!/usr/bin/env bash
# Configure and build into build/ (incremental on a second run).
# Warnings are errors under CI (CI=true) or with WERROR=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/configure.sh
st_configure build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
