#!/usr/bin/env bash
# Fuzz the parsers of the files users hand shardtrain (tests/fuzz/README.md)
# with libFuzzer: builds build-fuzz (clang, CPU backend, ASan + UBSan +
# coverage) and runs each target for SECONDS (default 60) from its committed
# inputs, one after another. Findings are written to fuzz-out/TARGET/ as
# crash-*, leak-*, oom-* or timeout-*; the script exits 1 when there is one.
# A finding fixed goes into tests/fuzz/corpus/TARGET/ under a name that says
# what it was: ctest replays it from then on (fuzz_TARGET).
#
#   scripts/fuzz.sh [SECONDS] [TARGET ...]    targets: safetensors sf_dir
#               hf_config tokenizer llmc tokens_bin shards peft gemm_cache parse cli
# Needs clang with libFuzzer (Debian: clang). Not part of scripts/test.sh:
# fuzzing has no end, and its run time is what you give it.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
case "$SECONDS_EACH" in
  ''|*[!0-9]*) echo "scripts/fuzz.sh: SECONDS must be a whole number, got '$SECONDS_EACH'" >&2
               exit 2 ;;
esac
ALL="safetensors sf_dir hf_config tokenizer llmc tokens_bin shards peft gemm_cache parse cli"
TARGETS=${*:-$ALL}
for t in $TARGETS; do
  case " $ALL " in *" $t "*) ;; *) echo "scripts/fuzz.sh: no target '$t' (one of: $ALL)" >&2
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
  grep -E "^Done|stat::number_of_executed_units" "$out/log.txt" | head -2
  if [ $rc -ne 0 ]; then
    found=1
    echo "   FINDING (exit $rc): $(ls "$out" | grep -E '^(crash|leak|oom|timeout)-' | head -3)"
    grep -E "^(SUMMARY|fuzz:)" "$out/log.txt" | head -3 | sed 's/^/   /'
  fi
done
exit $found
