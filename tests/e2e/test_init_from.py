"""train --init-from: fine-tuning starts from a model source's weights.

On 2 CPU ranks, ZeRO 1 and 2, from tests/data/hf/tiny (64 positions)
trained at --seq-len 16 on an llm.c token file of ids < 1000:
- the step-1 loss is the loss of the imported weights on the first global
  batch (computed here from transformers-parity logits: tests/hf_logits.c),
  not a random init's;
- --stop-after 3 then the same command again (--resume auto wins over
  --init-from, with its one notice line) gives losses bit-identical to the
  uninterrupted run;
- --init-from of the run directory `ckpt import` wrote gives the same step-1
  loss, bit for bit, as the Hugging Face directory;
- a conflicting --layers is exit 2 naming it; --seq-len past the positions
  is exit 2; the checkpoint keeps 64 positions and seq_len 16.
"""
import argparse
import json
import os
import shutil

import numpy as np

from common import check, losses, run

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--mpirun", default="mpirun")
p.add_argument("--driver", required=True)
p.add_argument("--work", required=True)
a = p.parse_args()
shutil.rmtree(a.work, ignore_errors=True)
os.makedirs(a.work)
W = lambda n: os.path.join(a.work, n)
TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf", "tiny")
T, G, V = 16, 8, 1000


def write_bin(path, toks):
    h = np.zeros(256, np.int32)
    h[:3] = (20240520, 1, len(toks))
    open(path, "wb").write(h.tobytes() + toks.astype(np.uint16).tobytes())


rng = np.random.default_rng(7)
# a learnable sequence (a repeating walk) with noise, every id < 1000
train_toks = (np.cumsum(rng.integers(1, 4, 12000)) % V).astype(np.uint16)
write_bin(W("train.bin"), train_toks)
write_bin(W("val.bin"), (np.cumsum(rng.integers(1, 4, 2000)) % V).astype(np.uint16))


def train(out, extra, np_=2, expect_rc=0):
    args = ["--data", W("train.bin"), "--val-data", W("val.bin"), "--out", W(out),
            "--seq-len", T, "--micro-batch", 2, "--global-batch", G, "--steps", 6,
            "--warmup", 2, "--lr", 3e-3, "--device", "cpu", "--val-seqs", 8] + extra
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(np_), a.bin, "train"] + [str(x) for x in args]
    return run(cmd, expect_rc=expect_rc)


# the imported weights' loss on the first global batch: sequences i*T..i*T+T
ids = np.stack([train_toks[i * T:i * T + T] for i in range(G)]).astype(np.int32)
tgt = np.stack([train_toks[i * T + 1:i * T + T + 1] for i in range(G)]).astype(np.int64)
ids.tofile(W("ids.i32"))
run([a.driver, TINY, W("ids.i32"), str(G), str(T), W("lg.f32")])
lg = np.fromfile(W("lg.f32"), dtype="<f4").reshape(G, T, V).astype(np.float64)
lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
ref = float((lse - np.take_along_axis(lg, tgt[..., None], -1)[..., 0]).mean())

for z in (1, 2):
    r = train(f"full_z{z}", ["--init-from", TINY, "--zero", z])
    full = losses(W(f"full_z{z}"))
    check(abs(full[1] - ref) < 1e-4,
          f"ZeRO {z}: step-1 loss {full[1]:.6f} = the imported weights' loss {ref:.6f}")
    check(full[6] < full[1], f"ZeRO {z}: fine-tuning lowers the loss ({full[1]:.4f} -> "
          f"{full[6]:.4f})")
    train(f"split_z{z}", ["--init-from", TINY, "--zero", z, "--stop-after", 3])
    r = train(f"split_z{z}", ["--init-from", TINY, "--zero", z])
    check("--init-from" in r.stdout and "not read" in r.stdout and "does not restart" in r.stdout,
          f"ZeRO {z}: the resume wins over --init-from, said in one notice line")
    split = losses(W(f"split_z{z}"))
    check(split == full, f"ZeRO {z}: stop-after 3 + resume is bit-identical to the "
          f"uninterrupted run ({len(full)} steps)")

fresh = losses(W("full_z1"))
train("random", ["--layers", 2, "--heads", 4, "--dim", 64, "--vocab-size", 1000])
# 10x the tolerance that calls the imported run's loss equal: how far a random
# init's loss lands from the tiny model's depends on the draw, not on a bug
check(abs(losses(W("random"))[1] - ref) > 1e-3, "a random init's step-1 loss differs "
      f"({losses(W('random'))[1]:.4f} vs {ref:.4f})")

run([a.bin, "ckpt", "import", TINY, "--out", W("imported")])
train("from_run", ["--init-from", W("imported"), "--zero", 1])
check(losses(W("from_run"))[1] == fresh[1],
      "--init-from the imported run directory: the same step-1 loss, bit for bit")

r = train("bad_layers", ["--init-from", TINY, "--layers", 3], expect_rc=2)
check("--layers" in r.stderr and "drop --layers" in r.stderr,
      "a conflicting --layers is exit 2 naming it")
r = train("bad_seq", ["--init-from", TINY, "--seq-len", 128], expect_rc=2)
check("--seq-len 128 exceeds the 64 positions" in r.stderr, "--seq-len past the positions: exit 2")

info = run([a.bin, "ckpt", "info", W("full_z1")]).stdout
cfg = json.loads(info.split("config ", 1)[1].splitlines()[0])
check(cfg["model"]["block_size"] == 64 and cfg["train"]["seq_len"] == T
      and cfg["train"]["init_from"] == TINY and cfg["model"]["name"] == "imported",
      "the checkpoint keeps 64 positions, seq_len 16 and where it came from")
run([a.bin, "ckpt", "verify", W("full_z2")])
# a resume without --init-from (the source may be gone): the config keeps where it came from
train("split_z1", ["--steps", 8])
cfg = json.loads(run([a.bin, "ckpt", "info", W("split_z1")]).stdout.split("config ", 1)[1]
                 .splitlines()[0])
check(cfg["train"]["init_from"] == TINY and cfg["train"]["seq_len"] == T and
      losses(W("split_z1"))[8] > 0, "resuming without --init-from continues, and the config "
      "still names the source")
print("all --init-from checks passed")
