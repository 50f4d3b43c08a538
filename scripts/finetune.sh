#!/usr/bin/env bash
# Fine-tune a Hugging Face GPT-2 model directory on the King James Bible with
# the GPT-2 tokenizer, on 2 CPU ranks, then eval, sample, export and reload
# the export in transformers (where it is installed):
#
#   scripts/finetune.sh [MODEL_DIR]
#
# MODEL_DIR defaults to tests/data/hf/demo, a randomly initialised GPT-2
# (vocabulary 50257, 256 positions, width 32, 2 layers; saved by
# transformers' save_pretrained: no pretrained weights can be downloaded
# here). A real `gpt2` directory (config.json + model.safetensors) takes the
# same path; at 124M parameters it wants a GPU (`--device cuda`, STEPS, SEQ
# and MB below). Each run of this script is a fresh fine-tune into
# runs/finetune/ (OUT=DIR for another); a runs/finetune/ left by an earlier
# run is moved aside to runs/finetune.N first, never deleted. The tokenized
# data in data/ is kept and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-tests/data/hf/demo}
if [ ! -f "$MODEL/config.json" ] && [ ! -f "$MODEL" ] && [ ! -d "$MODEL/ckpt" ]; then
  echo "finetune.sh: $MODEL is not a model: give a Hugging Face directory (config.json +" \
       "model.safetensors), an llm.c model file or a shardtrain run directory" >&2
  exit 2
fi
bash scripts/deps.sh
bash scripts/build.sh
BIN=build/shardtrain
TOK=$(bash scripts/get_gpt2_tokenizer.sh)
echo "tokenizer: GPT-2's encoder.json + vocab.bpe in $TOK"

mkdir -p data
[ -s data/kjv.txt ] || bible -f "gen1:1-rev22:21" > data/kjv.txt
if [ ! -s data/kjv_gpt2.h5 ]; then
  $BIN prep --tokenizer "$TOK" --input data/kjv.txt --out data/kjv_gpt2.h5 --val-fraction 0.02
else
  echo "prep: data/kjv_gpt2.h5 exists, skipping"
fi

OUT=${OUT:-runs/finetune}
if [ -e "$OUT" ]; then
  n=1
  while [ -e "$OUT.$n" ]; do n=$((n + 1)); done
  mv "$OUT" "$OUT.$n"
  echo "finetune.sh: the earlier $OUT is now $OUT.$n (nothing deleted)"
fi
mkdir -p "$OUT"
NP=${NP:-2}
STEPS=${STEPS:-100}
SEQ=${SEQ:-128}
MB=${MB:-8}
MPIRUN=(mpirun -np "$NP" --bind-to none --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

echo "== import $MODEL"
$BIN ckpt import "$MODEL" --out $OUT/base
echo "== eval before fine-tuning"
$BIN eval --init $OUT/base --data data/kjv_gpt2.h5 --seq-len "$SEQ" --device cpu --json | tee $OUT/eval_before.json
echo "== fine-tune on $NP ranks, ZeRO-1"
start=$(date +%s)
"${MPIRUN[@]}" $BIN train --init-from $OUT/base --data data/kjv_gpt2.h5 --out $OUT/run \
  --seq-len "$SEQ" --micro-batch "$MB" --global-batch $((MB * NP)) --zero 1 --steps "$STEPS" \
  --lr 3e-3 --warmup 20 --val-every 50 --log-every 10 --ckpt-every 50 --device cpu
end=$(date +%s)
echo "== eval after fine-tuning"
$BIN eval --init $OUT/run --data data/kjv_gpt2.h5 --seq-len "$SEQ" --device cpu --json | tee $OUT/eval_after.json
echo "== sample"
$BIN sample --init $OUT/run --prompt "And God said" --max-new 40 --temperature 0.8 --top-k 40 \
  --seed 1 --device cpu
echo "== export to $OUT/export (Hugging Face) and $OUT/model.llmc.bin (llm.c)"
$BIN ckpt export $OUT/run --out $OUT/export
$BIN ckpt export $OUT/run --out $OUT/model.llmc.bin --format llmc
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
b = json.load(open(f"{out}/eval_before.json"))
a = json.load(open(f"{out}/eval_after.json"))
print(f"validation loss: {b['loss']:.3f} before, {a['loss']:.3f} after fine-tuning "
      f"({a['tokens']} tokens)")
try:
    import torch
    from transformers import GPT2LMHeadModel
except ImportError:
    print("transformers/torch not installed here: the export was not reloaded "
          f"(GPT2LMHeadModel.from_pretrained('{out}/export') loads it)")
    sys.exit(0)
m = GPT2LMHeadModel.from_pretrained(f"{out}/export")
print(f"transformers loaded {out}/export: {sum(p.numel() for p in m.parameters())} parameters")
PY
echo "fine-tune wall time: $((end - start)) s; run directory: $OUT/run"
