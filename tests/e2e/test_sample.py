"""shardtrain sample and eval on a checkpoint train wrote (byte tokens):

- eval equals the mean validation loss train reports for the same windows
  (--seq-len = train's, --max-windows = --val-seqs), whatever --micro-batch
  (a partial last batch counts only its real windows); eval over two .bin
  shards is the token-weighted mean of each; --split train works; a file
  whose recorded vocabulary exceeds the model's is refused (exit 4);
- KV-cache greedy equals full forwards at every step (tests/test_infer
  with the checkpoint);
- sample: greedy repeats; a seed repeats and another seed differs; top-k 1
  and a tiny top-p equal greedy; bad flags give one line and exit 2;
- a text-mode sample prints the continuation right after the prompt: the
  bytes of the --print-ids run of the prompt's bytes, then a newline;
  the block size stops a default --max-new, and says so."""
import argparse
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import check, corpus, run, train  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--mpirun", default="mpirun")
p.add_argument("--work", required=True)
p.add_argument("--infer-test", required=True)
a = p.parse_args()
shutil.rmtree(a.work, ignore_errors=True)
os.makedirs(a.work)
W = lambda n: os.path.join(a.work, n)

data = corpus(a)
T, VAL_SEQS = 64, 12
train(a, 1, ["--data", data, "--model", "tiny", "--seq-len", T, "--micro-batch", 4,
             "--global-batch", 4, "--steps", 40, "--val-seqs", VAL_SEQS, "--out", W("run"),
             "--lr", "3e-3"])
val = [json.loads(l) for l in open(W("run/metrics.jsonl")) if "val_loss" in l][-1]["val_loss"]


def ev(*args, rc=0):
    r = run([a.bin, "eval", "--init", W("run"), "--device", "cpu", "--json"] + [str(x) for x in args],
            expect_rc=rc)
    return json.loads(r.stdout.strip().splitlines()[-1]) if rc == 0 else r


for mb in (1, 5, 12):
    e = ev("--data", data, "--seq-len", T, "--max-windows", VAL_SEQS, "--micro-batch", mb)
    check(abs(e["loss"] - val) <= 1e-6 * val and e["tokens"] == VAL_SEQS * T,
          f"eval --micro-batch {mb}: loss {e['loss']:.9g} = train's val loss {val:.9g}, "
          f"{e['tokens']} tokens")
with h5py.File(data, "r") as f:
    vtok = f["val"][...]


def write_bin(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())


write_bin(W("a.bin"), vtok[:1000])
write_bin(W("b.bin"), vtok[1000:2500])
full = ev("--data", W("a.bin"))
check(full["seq_len"] == T and full["windows"] == 999 // T and
      abs(full["perplexity"] - np.exp(full["loss"])) < 1e-9 * full["perplexity"],
      f"eval default: seq-len = block size {T}, every window of the file ({full['windows']}), "
      f"perplexity = exp(loss)")
ea, eb = ev("--data", W("a.bin"), "--seq-len", 32), ev("--data", W("b.bin"), "--seq-len", 32)
eab = ev("--data", W("a.bin"), "--data", W("b.bin"), "--seq-len", 32, "--micro-batch", 7)
mean = (ea["loss"] * ea["tokens"] + eb["loss"] * eb["tokens"]) / (ea["tokens"] + eb["tokens"])
check(eab["tokens"] == ea["tokens"] + eb["tokens"] == (999 // 32 + 1499 // 32) * 32 and
      abs(eab["loss"] - mean) < 1e-9 * mean, "two .bin shards: windows per shard, the "
      "token-weighted mean of each")
tr = ev("--data", data, "--split", "train", "--max-windows", 3)
check(tr["tokens"] == 3 * T, "--split train")
shutil.copy(data, W("big_vocab.h5"))
with h5py.File(W("big_vocab.h5"), "a") as f:
    f.attrs["vocab_size"] = 1000
r = ev("--data", W("big_vocab.h5"), rc=4)
check("1000" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      "a token file of a larger vocabulary: exit 4, " + r.stderr.strip())
r = ev("--data", data, "--seq-len", T + 1, rc=2)
check("--seq-len" in r.stderr, "--seq-len past the block size: exit 2")

r = run([a.infer_test, W("run")], env={"OMP_NUM_THREADS": "2"})
check("greedy steps agree with full forwards" in r.stdout,
      "KV-cache greedy = argmax of full st_model_forward at every step, on the checkpoint")

PROMPT = [73, 110, 32, 116, 104, 101]  # "In the"


def sample(*args, rc=0):
    return run([a.bin, "sample", "--init", W("run"), "--device", "cpu"] + [str(x) for x in args],
               expect_rc=rc)


def ids(*args):
    r = sample("--prompt-ids", ",".join(map(str, PROMPT)), "--print-ids", *args)
    return [int(x) for x in r.stdout.strip().split(",")]


g = ids("--temperature", 0, "--max-new", 30)
check(len(g) == 30 and ids("--temperature", 0, "--max-new", 30) == g, "greedy repeats, 30 ids")
step_dir = W("run/ckpt/step_00000040")
r = run([a.bin, "sample", "--init", step_dir, "--device", "cpu", "--prompt-ids",
         ",".join(map(str, PROMPT)), "--print-ids", "--temperature", "0", "--max-new", "30"])
check([int(x) for x in r.stdout.strip().split(",")] == g, "a step directory samples as its run")
s7 = ids("--seed", 7, "--max-new", 30)
check(ids("--seed", 7, "--max-new", 30) == s7, "the same seed repeats exactly")
check(ids("--seed", 8, "--max-new", 30) != s7, "another seed gives another sample")
check(ids("--top-k", 1, "--max-new", 30) == g, "top-k 1 equals greedy")
check(ids("--top-p", "1e-6", "--temperature", 1.5, "--max-new", 30) == g, "tiny top-p equals greedy")
tk = ids("--top-k", 3, "--top-p", 0.9, "--seed", 3, "--max-new", 30)
check(len(tk) == 30 and all(0 <= x < 256 for x in tk), "top-k with top-p samples")

for bad in (["--top-p", 0], ["--top-p", 1.5], ["--temperature", -1], ["--top-k", -1],
            ["--max-new", 0], ["--max-new", T], ["--temperature", "nan"], ["--bogus", 1]):
    r = sample("--prompt-ids", "1,2", *bad, rc=2)
    lines = r.stderr.strip().splitlines()
    check(len(lines) == 1 and bad[0] in lines[0], f"{' '.join(map(str, bad))}: exit 2, {lines[0]}")
r = sample("--prompt-ids", "1,256", rc=2)
check("--prompt-ids" in r.stderr, "a prompt id outside the vocabulary: exit 2")

text = sample("--prompt", "In the", "--temperature", 0, "--max-new", 30)
check(text.stdout.encode("latin-1") == bytes(g) + b"\n" or
      text.stdout.encode() == bytes(g) + b"\n",
      f"text mode prints the continuation right after the prompt: {text.stdout!r}")
check("tokens/s" in text.stderr and "prefill" in text.stderr, "tokens/s on stderr: " +
      text.stderr.strip())
d = sample("--prompt", "In the", "--temperature", 0, "--json")
s = json.loads(d.stderr.strip().splitlines()[-1])
check(s["stop"] == "block-size" and s["new_tokens"] == T - len(PROMPT) and s["prompt_tokens"] == 6,
      f"a default --max-new stops at the block size and says so: {s}")
