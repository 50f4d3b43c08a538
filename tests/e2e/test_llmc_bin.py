"""llm.c .bin shards train exactly like the same tokens in an HDF5 token
file: write /train and /val of a prepared file as .bin shards (256 int32
header: magic 20240520, version 1, token count; then uint16 tokens) and
check both runs log identical train and validation losses."""
import json
import os

import h5py
import numpy as np

from common import check, corpus, parse_args, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)


def write_bin(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())


with h5py.File(data, "r") as f:
    write_bin(W("train.bin"), f["train"][...])
    write_bin(W("val.bin"), f["val"][...])

common = ["--model", "tiny", "--seq-len", 32, "--micro-batch", 2, "--global-batch", 4,
          "--steps", 6, "--val-every", 3, "--val-seqs", 8]
train(a, 2, ["--data", data, "--out", W("h5")] + common)
r = train(a, 2, ["--data", W("train.bin"), "--val-data", W("val.bin"), "--vocab-size", 256,
                 "--out", W("bin")] + common)
check("train.bin" in r.stdout, "config block names the .bin shard")


def lines(run):
    return [d for d in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if "step" in d]


h5, bn = lines(W("h5")), lines(W("bin"))
key = lambda d: (d["step"], d.get("loss"), d.get("val_loss"))
check([key(d) for d in h5] == [key(d) for d in bn],
      f"{len(h5)} metric lines (train and val losses) identical for .h5 and .bin data")
