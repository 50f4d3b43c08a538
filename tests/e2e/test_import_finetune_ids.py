"""Ids of an imported Hugging Face model through fine-tuning and sampling,
on the CPU (tests/data/hf/llama-tiny: bos 1, eos 2, pad null, vocabulary
300, no tokenizer files; byte tokens, which its 300 ids hold):

- the special ids travel: `ckpt import` keeps config.json's bos/eos/pad ids
  in the checkpoint's config ("hf_special_ids"), and the export of a run
  trained 2 steps with `train --init-from` the import, of that run resumed
  for a third step, and of a run trained with `--init-from` the directory
  itself each writes the source's bos_token_id/eos_token_id/pad_token_id;
  more ids than a checkpoint keeps (150 eos ids) are refused by import and
  train with exit 3 and one line;
- `sample --tokenizer bytes` of the import (whose greedy continuation of
  "And God said" holds ids past 255) prints each id's byte, and
  `<|id:N|>` for an id past the byte tokenizer's 256 instead of nothing;
  --print-ids prints the ids themselves.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import corpus_text, parse_args, run, train  # noqa: E402
from common import soft_check as check, soft_finish  # noqa: E402

a = parse_args()
REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "tests", "data", "hf", "llama-tiny")
W = lambda *p: os.path.join(a.work, *p)  # noqa: E731
KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
src = json.load(open(os.path.join(MODEL, "config.json")))
want = {k: src[k] for k in KEYS if k in src}
assert want.get("bos_token_id") is not None and want.get("eos_token_id") is not None, \
    f"{MODEL}/config.json must have bos and eos ids for this test"

open(W("text.txt"), "w").write(corpus_text()[:40000])
run([a.bin, "prep", "--input", W("text.txt"), "--out", W("text.h5"), "--val-fraction", "0.1"])
run([a.bin, "ckpt", "import", MODEL, "--out", W("base")])
TRAIN = ["--data", W("text.h5"), "--seq-len", 32, "--micro-batch", 2, "--global-batch", 2,
         "--zero", 0, "--lr", 1e-3, "--warmup", 0, "--val-every", 0, "--val-seqs", 2]


def exported_ids(run_dir, name, step):
    r = run([a.bin, "ckpt", "export", run_dir, "--out", W(name), "--format", "hf"])
    check(f"step_{step:08d}" in r.stdout, f"{name}: exports step {step} ({r.stdout.strip()})")
    cfg = json.load(open(W(name, "config.json")))
    return {k: cfg[k] for k in KEYS if k in cfg}


check(exported_ids(W("base"), "base_export", 0) == want,
      f"the import's export has the source's ids {want}")
train(a, 1, ["--init-from", W("base"), "--out", W("run"), "--steps", 2] + TRAIN)
got = exported_ids(W("run"), "run_export", 2)
check(got == want, f"a 2-step fine-tune of the import exports the source's ids: {got}")
train(a, 1, ["--out", W("run"), "--data", W("text.h5"), "--steps", 3])
got = exported_ids(W("run"), "resumed_export", 3)
check(got == want, f"the fine-tune resumed for a third step exports them too: {got}")
train(a, 1, ["--init-from", MODEL, "--out", W("direct"), "--steps", 2] + TRAIN)
got = exported_ids(W("direct"), "direct_export", 2)
check(got == want, f"--init-from the Hugging Face directory itself: its export has them: {got}")

# --init-from another shape into a run that resumes: refused, naming the first
# field that differs and both values (was a garbled list of five numbers).
QWEN = os.path.join(REPO, "tests", "data", "hf", "qwen2-tiny")
r = train(a, 1, ["--init-from", QWEN, "--out", W("run"), "--steps", 4] + TRAIN, expect_rc=None)
check(r.returncode == 3 and "qwen2-tiny is a qwen2 model with --dim 48" in r.stderr
      and "which --resume continues, has --dim 64: give another --out" in r.stderr,
      f"--init-from a Qwen2 into the Llama run: exit 3 naming --dim and both values "
      f"(got {r.returncode}: {r.stderr.strip()[-300:]})")

# More ids than a checkpoint's config keeps: refused, one line naming the file's field.
shutil.copytree(MODEL, W("long_eos"))
long_cfg = dict(src, eos_token_id=list(range(1000, 1150)))
json.dump(long_cfg, open(W("long_eos", "config.json"), "w"))
for cmd in ([a.bin, "ckpt", "import", W("long_eos"), "--out", W("long_import")],
            [a.bin, "train", "--init-from", W("long_eos"), "--out", W("long_run"), "--steps", "1",
             "--device", "cpu"] + [str(x) for x in TRAIN]):
    r = run(cmd, expect_rc=None)
    check(r.returncode == 3 and r.stderr.count("\n") == 1 and "eos_token_id" in r.stderr
          and "long_eos" in r.stderr, f"{cmd[1]}: 150 eos ids refused, exit 3, one line "
          f"(got {r.returncode}: {r.stderr.strip()[:240]})")

# Byte tokens under the 300-id import: greedy, so text and ids are one sample.
SAMPLE = [a.bin, "sample", "--init", W("base"), "--tokenizer", "bytes", "--prompt",
          "And God said", "--max-new", "24", "--temperature", "0", "--device", "cpu"]
ids = [int(x) for x in run(SAMPLE + ["--print-ids"]).stdout.strip().split(",")]
check(len(ids) == 24 and any(i >= 256 for i in ids) and any(i < 256 for i in ids),
      f"--print-ids: 24 ids, bytes and ids past 255 both: {ids}")
r = subprocess.run(SAMPLE, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
text = b"".join(bytes([i]) if i < 256 else f"<|id:{i}|>".encode() for i in ids) + b"\n"
check(r.returncode == 0 and r.stdout == text,
      f"text: each byte, and <|id:N|> past 255: {r.stdout!r}, want {text!r}")
soft_finish()
