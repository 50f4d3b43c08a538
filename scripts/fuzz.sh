#!/usr/bin/env bash
# Fuzz the parsers of the files users hand shardtrain (tests/fuzz/README.md)
# with libFuzzer: builds build-fuzz (clang, CPU backend, ASan + UBSan +
# coverage) and runs each target for SECONDS (default 60; 1-86400) from its
# committed inputs, one after another, printing per target the inputs run
# and whether it found something. fuzz-out/TARGET/ (git-ignored) then holds
# log.txt (libFuzzer's output), corpus/ (the inputs it kept for new
# coverage: a scratch corpus the next run starts from too; commit none of
# it) and any finding, crash-*, leak-*, oom-* or timeout-*. The script exits
# 1 when this run found something (an old finding file left there does not
# count). A finding fixed goes into tests/fuzz/corpus/TARGET/ under a name
# that says what it was: ctest replays it from then on (fuzz_TARGET).
#
#   scripts/fuzz.sh [SECONDS] [TARGET ...]    targets: safetensors sf_dir
#               hf_config tokenizer llmc tokens_bin shards peft gemm_cache parse cli
# Needs clang with libFuzzer (Debian: clang). Not part of scripts/test.sh:
# fuzzing has no end, and its run time is what you give it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
SECONDS_EACH=${1:-60}
shift || true
# 0 would be libFuzzer's "no limit": a run that never ends
case "$SECONDS_EACH" in
  ''|*[!0-9]*|0*) echo "scripts/fuzz.sh: SECONDS must be a whole number from 1 to 86400, got" \
                       "'$SECONDS_EACH' (scripts/fuzz.sh --help)" >&2
                  exit 2 ;;
esac
if [ "${#SECONDS_EACH}" -gt 5 ] || [ "$SECONDS_EACH" -gt 86400 ]; then
  echo "scripts/fuzz.sh: SECONDS must be a whole number from 1 to 86400, got" \
       "'$SECONDS_EACH' (scripts/fuzz.sh --help)" >&2
  exit 2
fi
ALL="safetensors sf_dir hf_config tokenizer llmc tokens_bin shards peft gemm_cache parse cli"
TARGETS=${*:-$ALL}
for t in $TARGETS; do
  case " $ALL " in *" $t "*) ;; *) echo "scripts/fuzz.sh: no target '$t' (one of: $ALL;" \
                                       "the ctest and binary names add fuzz_)" >&2
                                  exit 2 ;; esac
done
command -v clang >/dev/null || { echo "scripts/fuzz.sh: needs clang (apt-get install clang)" >&2
                                 exit 2; }
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSHARDTRAIN_CUDA=OFF -DSHARDTRAIN_FUZZ=ON >/dev/null
fi
ninja -C build-fuzz $(for t in $TARGETS; do printf 'fuzz_%s_libfuzzer ' "$t"; done) >/dev/null
found=0
for t in $TARGETS; do
  out=fuzz-out/$t
  mkdir -p "$out/corpus"
  # the committed inputs seed it; what libFuzzer adds stays in fuzz-out
  max_len=4096
  case $t in tokenizer) max_len=70000 ;; parse) max_len=64 ;; cli) max_len=1024 ;; llmc) max_len=8192 ;; esac
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  echo "== fuzz_$t: ${SECONDS_EACH} s"
  set +e
  "build-fuzz/tests/fuzz/fuzz_${t}_libfuzzer" -max_total_time="$SECONDS_EACH" \
    -max_len=$max_len -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$out/" "$out/corpus" "tests/fuzz/corpus/$t" > "$out/log.txt" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log.txt" | tail -1)
  if [ $rc -ne 0 ]; then
    found=1
    echo "   FINDING (exit $rc) after ${runs:-?} inputs:" \
         "$(ls -t "$out" | grep -E '^(crash|leak|oom|timeout|slow-unit)-' | head -1)"
    grep -E "^(SUMMARY|fuzz:)" "$out/log.txt" | head -3 | sed 's/^/   /'
  else
    echo "   no finding in ${runs:-?} inputs"
  fi
  echo "   log: $out/log.txt"
done
if [ $found -ne 0 ]; then
  echo "findings are the crash-*/leak-*/oom-*/timeout-* files in fuzz-out/TARGET/; replay one:" \
       "build-fuzz/tests/fuzz/fuzz_TARGET_libfuzzer FILE (tests/fuzz/README.md)"
fi
exit $found
