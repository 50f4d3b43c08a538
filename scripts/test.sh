#!/usr/bin/env bash
# Install dependencies, build, and run the whole ctest suite: unit tests,
# the Hugging Face golden test, multi-rank runs under mpirun -np 1/2/4,
# checkpoint round trips and fault tests. GPU tests skip cleanly without a GPU.
# Then static analysis (clang-tidy's clang-analyzer over every C file,
# scripts/static_analysis.sh) and the AddressSanitizer + UBSan build of the
# CPU backend running the unit and multi-rank tests (scripts/sanitizers.sh).
# Each stage prints its wall time. ST_SKIP_ANALYSIS=1 or ST_SKIP_SANITIZERS=1
# leaves a stage out (for a quick local run; CI runs all). Arguments go to
# ctest (e.g. -R e2e_resume); --help prints this and runs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  cat <<'EOF_HELP'
usage: scripts/test.sh [CTEST_ARGS...]
  Stages, each timed: deps (apt packages, needs root), build (build/),
  ctest (every test; CTEST_ARGS go to ctest, e.g. -R e2e_resume), static
  analysis (clang-tidy's analyzer over every C file), sanitizers (an
  ASan + UBSan build of the CPU backend in build-asan/, its tests).
  ST_SKIP_ANALYSIS=1, ST_SKIP_SANITIZERS=1: leave that stage out.
  About 16-30 minutes on two otherwise idle cores from a clean clone,
  packages already installed: 965 s with CI=true (build 34 s, ctest 467 s,
  static analysis 48 s, sanitizers 416 s) up to 1,711 s for CI's own run;
  longer when the cores are shared (README, "Tests").
EOF_HELP
  exit 0
fi
stage() { # name command...: run, time, and fail the script on failure
  local name=$1 t0=$SECONDS rc=0; shift
  echo "== $name"
  "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    # one closing line naming the stage, so a long log's end says what failed
    echo "== FAILED: stage $name exited $rc after $((SECONDS - t0)) s (total $SECONDS s); its output is above"
    exit "$rc"
  fi
  echo "== $name: done in $((SECONDS - t0)) s"
}
stage deps bash scripts/deps.sh
stage build bash scripts/build.sh
stage ctest bash -c 'cd build && ctest --output-on-failure -j 1 "$@"' ctest "$@"
[ "${ST_SKIP_ANALYSIS:-0}" = "1" ] || stage static-analysis bash scripts/static_analysis.sh
[ "${ST_SKIP_SANITIZERS:-0}" = "1" ] || stage sanitizers bash scripts/sanitizers.sh
echo "== all stages passed in $SECONDS s"
