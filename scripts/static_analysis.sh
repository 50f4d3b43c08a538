#!/usr/bin/env bash
# Static analysis: clang-tidy's clang-analyzer checks over every C file the
# build compiles (tests included), through compile_commands.json. The CUDA
# backend is configured ON where nvcc exists, so its C host files
# (kernels/cuda/*.c, collectives/collectives_nccl.c, and st_core with
# SHARDTRAIN_HAVE_CUDA) are analysed; .cu files are not C and are skipped.
# Exits non-zero on any finding. A false positive is suppressed in place:
#   // NOLINT(clang-analyzer-...): <why it cannot happen>
# Usage: scripts/static_analysis.sh [BUILD_DIR]   (default build-tidy)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${1:-build-tidy}
checks='-*,clang-analyzer-core.*,clang-analyzer-unix.*,clang-analyzer-deadcode.*'
tidy=$(command -v clang-tidy || true)
if [ -z "$tidy" ]; then
  echo "static_analysis: clang-tidy not found (scripts/deps.sh installs Debian's clang-tidy)" >&2
  exit 1
fi
cuda=OFF
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] && cuda=ON
# Configure only: the analysis needs the compile commands, not the objects.
mkdir -p "$dir"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
      -DSHARDTRAIN_CUDA=$cuda >"$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log" >&2; echo "static_analysis: configure failed" >&2; exit 1; }
mapfile -t files < <(/usr/bin/python3 - "$dir/compile_commands.json" <<'PY'
import json, sys
seen = []
for e in json.load(open(sys.argv[1])):
    f = e["file"]
    if f.endswith(".c") and f not in seen:
        seen.append(f)
print("\n".join(seen))
PY
)
echo "static_analysis: clang-tidy ($("$tidy" --version | sed -n 's/.*version \([0-9.]*\).*/\1/p' | head -1)), CUDA backend $cuda, ${#files[@]} C files"
log="$dir/clang-tidy.log"
# One clang-tidy per file, one per core: a finding in any file fails the run.
# Headers of the repository count (--header-filter); system headers do not.
status=0
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 1 \
  "$tidy" -p "$dir" --quiet --checks="$checks" --warnings-as-errors='*' \
          --header-filter="^$root/" >"$log" 2>&1 || status=$?
findings=$(grep -cE '(warning|error): .*\[clang-' "$log" || true)
if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
  grep -E -A8 '(warning|error): ' "$log" | head -400 >&2
  echo "static_analysis: FAILED, $findings finding(s) in ${#files[@]} C files (full log: $log)" >&2
  exit 1
fi
echo "static_analysis: OK, 0 findings in ${#files[@]} C files"
