#!/usr/bin/env bash
# The sanitizer build's own check (ctest sanitizer_self_test, build-asan only):
# under the options CI uses (env.sh), an MPI program that leaks 4096 bytes of
# its own is stopped (exit 134) with exactly that leak reported, none of Open
# MPI's; one with a signed overflow stops at it; a clean one exits 0.
# Usage: self_test.sh SELF_CHECK_BINARY MPIRUN
set -uo pipefail
bin=$1 mpirun=$2
source "$(dirname "$0")/env.sh"
run() { "$mpirun" --allow-run-as-root -np 1 "$bin" "$1" 2>&1; }
fail=0
out=$(run clean); rc=$?
[ $rc -eq 0 ] || { echo "FAIL clean: exit $rc (Open MPI's leaks not suppressed?)"; echo "$out" | head -40; fail=1; }
out=$(run leak); rc=$?
if [ $rc -eq 0 ] || ! grep -q st_self_check_leak <<<"$out" ||
   ! grep -q "SUMMARY: AddressSanitizer: 4096 byte(s) leaked in 1 allocation(s)" <<<"$out"; then
  echo "FAIL leak: exit $rc; want non-zero with only our 4096-byte leak reported"; echo "$out" | head -40; fail=1
fi
out=$(run ubsan); rc=$?
if [ $rc -eq 0 ] || ! grep -q "signed integer overflow" <<<"$out" || grep -q "still running" <<<"$out"; then
  echo "FAIL ubsan: exit $rc; want a stop at the signed overflow"; echo "$out" | head -40; fail=1
fi
[ $fail -eq 0 ] && echo "sanitizer self-test: our leak reported, Open MPI's suppressed, UB stops the process"
exit $fail
