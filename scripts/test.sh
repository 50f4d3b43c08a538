#!/usr/bin/env bash
# Install dependencies, build, and run the whole ctest suite: unit tests,
# the Hugging Face golden test, multi-rank runs under mpirun -np 1/2/4,
# checkpoint round trips and fault tests. GPU tests skip cleanly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j 1 "$@"
