"""llm.c .bin shards train exactly like the same tokens in an HDF5 token
file: write /train and /val of a prepared file as .bin shards (256 int32
header: magic 20240520, version 1, token count; then uint16 tokens) and
check both runs log identical train and validation losses. Version 2
shards (uint32 tokens, llm.c's Llama 3 format) of the same tokens log the
same losses again, and a version 2 shard with ids past 65535 trains."""
import json
import os

import h5py
import numpy as np

from common import check, corpus, parse_args, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)


def write_bin(path, tokens, version=1):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, version, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2" if version == 1 else "<u4").tobytes())


with h5py.File(data, "r") as f:
    train_tokens, val_tokens = f["train"][...], f["val"][...]
for v, tag in ((1, ""), (2, "_v2")):
    write_bin(W(f"train{tag}.bin"), train_tokens, v)
    write_bin(W(f"val{tag}.bin"), val_tokens, v)

common = ["--model", "tiny", "--seq-len", 32, "--micro-batch", 2, "--global-batch", 4,
          "--steps", 6, "--val-every", 3, "--val-seqs", 8]
train(a, 2, ["--data", data, "--out", W("h5")] + common)
r = train(a, 2, ["--data", W("train.bin"), "--val-data", W("val.bin"), "--vocab-size", 256,
                 "--out", W("bin")] + common)
check("train.bin" in r.stdout, "config block names the .bin shard")


def lines(run):
    return [d for d in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if "step" in d]


train(a, 2, ["--data", W("train_v2.bin"), "--val-data", W("val_v2.bin"), "--vocab-size", 256,
             "--out", W("bin_v2")] + common)
h5, bn, b2 = lines(W("h5")), lines(W("bin")), lines(W("bin_v2"))
key = lambda d: (d["step"], d.get("loss"), d.get("val_loss"))
check([key(d) for d in h5] == [key(d) for d in bn],
      f"{len(h5)} metric lines (train and val losses) identical for .h5 and .bin data")
check([key(d) for d in b2] == [key(d) for d in bn],
      f"{len(b2)} metric lines identical for version 2 (uint32) and version 1 (uint16) shards")

# ids a uint16 cannot hold: Llama 3-sized ids in a version 2 shard
big = (train_tokens.astype(np.uint32) * 263 + 65536) % 70000
check(int(big.max()) > 65535, "the wide shard holds ids past 65535")
write_bin(W("wide.bin"), big, 2)
train(a, 1, ["--data", W("wide.bin"), "--vocab-size", 70000, "--out", W("wide"), "--steps", 2,
             "--model", "tiny", "--seq-len", 32, "--micro-batch", 2, "--global-batch", 2])
wide = lines(W("wide"))
check(len(wide) >= 2 and all(np.isfinite(d["loss"]) for d in wide if "loss" in d),
      f"a version 2 shard with ids up to {int(big.max())} trains (--vocab-size 70000): "
      f"losses {[d.get('loss') for d in wide]}")
