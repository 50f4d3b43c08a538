#!/bin/bash
# GPT-2 tokenizer speed: MB/s of English text per core, shardtrain's C BPE
# (the encode time prep's summary line reports) against tiktoken's gpt2
# encoding built from the same files, both on one thread. A benchmark, not a
# test.
#
#   bash bench/tokenizer_speed.sh [BUILD_DIR] [RUNS]    (default build, 3)
#
# Text: the whole KJV (data/kjv.txt, 4.4 MB; made from Debian's bible-kjv
# with `bible -f "gen1:1-rev22:21"` when missing). Tokenizer: GPT-2's
# encoder.json + vocab.bpe (scripts/get_gpt2_tokenizer.sh). Prints the best
# of RUNS for each side. tiktoken is skipped where it does not import (pip
# install tiktoken into .cache/oracle, as tests/e2e/test_tokenizer_parity.py
# does).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
RUNS=${2:-3}
mkdir -p data
if [ ! -s data/kjv.txt ]; then
  command -v bible >/dev/null || { echo "need data/kjv.txt or Debian's bible-kjv" >&2; exit 1; }
  bible -f "gen1:1-rev22:21" > data/kjv.txt
fi
G=$(bash scripts/get_gpt2_tokenizer.sh)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
best=0
for i in $(seq "$RUNS"); do
  line=$(OMP_NUM_THREADS=1 taskset -c 0 "$B/shardtrain" prep --tokenizer "$G" --input data/kjv.txt \
         --out "$tmp/kjv.h5")
  mbs=$(echo "$line" | sed -n 's/.* \([0-9.]*\) MB\/s$/\1/p')
  best=$(echo "$mbs $best" | awk '{print ($1 > $2) ? $1 : $2}')
done
echo "$line"
echo "shardtrain gpt2-bpe: $best MB/s (best of $RUNS, one core, $(wc -c < data/kjv.txt) bytes)"
/usr/bin/python3 - "$G" "$RUNS" <<'PY' || echo "tiktoken: skipped (not importable)"
import os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), ".cache", "oracle"))
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "tokenizer"))
os.environ["RAYON_NUM_THREADS"] = "1"
import oracle
enc = oracle.tiktoken_encoding(sys.argv[1])
text = open("data/kjv.txt", encoding="utf-8").read()
best = 0.0
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    enc.encode_ordinary(text)
    best = max(best, len(text.encode()) / 1e6 / (time.perf_counter() - t))
print(f"tiktoken {__import__('tiktoken').__version__} gpt2 (same files): {best:.1f} MB/s "
      f"(best of {sys.argv[2]}, encode_ordinary, one thread)")
PY
