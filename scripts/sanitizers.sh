#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of the CPU backend:
# builds build-asan (-DSHARDTRAIN_SANITIZE=ON -DSHARDTRAIN_CUDA=OFF) and runs
# the unit tests, the checkpoint tests under mpirun and the multi-rank e2e
# tests there. A finding aborts the process (SIGABRT, exit 134, which no
# test expects), so the test that met it fails. Leaks are reported at exit
# (LeakSanitizer) except those of Open MPI and hwloc (tests/sanitizers/lsan.supp).
# Not run here (README, "Tests"): netns_two_hosts and e2e_slurm_preempt, which
# test the launcher and the network rather than our code and would double CI's time.
# Usage: scripts/sanitizers.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
werror=OFF
[ "${CI:-}" = "true" ] || [ "${WERROR:-0}" = "1" ] && werror=ON
if [ ! -f build-asan/CMakeCache.txt ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDTRAIN_CUDA=OFF \
        -DSHARDTRAIN_SANITIZE=ON -DSHARDTRAIN_WERROR=$werror
fi
cmake --build build-asan -j "$(nproc)"
# The run-time options (abort on any finding, leak check at exit with Open
# MPI's suppressed), shared with the sanitizer_self_test ctest.
source tests/sanitizers/env.sh
cd build-asan
ctest --output-on-failure -j 1 -E '^(netns_two_hosts|e2e_slurm_preempt)$' "$@"
