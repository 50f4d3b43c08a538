"""train --data over several shards (docs/data.md).

Three shards of unequal length (37, 23 and 50 sequences of T = 16): an
llm.c version 1 .bin, an HDF5 file from `shardtrain prep` and another .bin,
cut with one token of overlap from one stream, so that in order they are
exactly the windows of one file holding the whole stream.

1. --shuffle off over the directory gives the same losses, bit for bit, as
   that single file (today's loader); auto on one file is off.
2. Shuffled (auto: several shards), with ST_DATA_TRACE logging every
   sequence each rank consumes: 30 steps of 8 sequences (2 epochs and a
   part) on 1, 2 and 4 ranks. Every epoch holds every (shard, sequence)
   exactly once, each shard as one block, in another order than file
   order and than the epoch before; the stream (position -> sequence and
   step) is the same on every rank count, and so are the losses (1e-5).
   Without the prefetch thread (ST_DATA_PREFETCH=0) the losses are equal
   bit for bit; version 2 (uint32) shards of the same tokens give them again.
3. Resume: stopped at step 10 on 1 rank (mid-epoch), resumed on 4 ranks:
   steps 11-20 (across the epoch boundary at sequence 110) read the same
   sequences and log the same losses (1e-5) as the uninterrupted run. A
   shard rewritten since (same size, other tokens) or a shard set of
   another count refuses with exit 4 and leaves the run directory as it
   was; --data-changed-ok resumes anyway.
4. Bad data, each exit 4 with one line naming the file, no input modified:
   a pattern matching nothing, a directory without token files, shards of
   two widths, of two vocabularies, a shard shorter than one sequence, a
   list entry that cannot be read.
"""
import json
import os
import shutil

import h5py
import numpy as np

from common import check, corpus, losses, parse_args, run, train, tree_digest

a = parse_args()
data = corpus(a)
W = lambda *n: os.path.join(a.work, *n)
T, NS = 16, (37, 23, 50)
N = sum(NS)

with h5py.File(data, "r") as f:
    stream = f["train"][: N * T + 1].astype(np.uint32)
cuts = [0, NS[0] * T, (NS[0] + NS[1]) * T, N * T]
pieces = [stream[cuts[i]: cuts[i + 1] + 1] for i in range(3)]


def write_bin(path, tokens, version=1):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, version, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2" if version == 1 else "<u4").tobytes())


os.makedirs(W("shards"))
os.makedirs(W("shards2"))
write_bin(W("shards", "a.bin"), pieces[0])
write_bin(W("shards", "c.bin"), pieces[2])
# prep's byte tokenizer: token = byte; --val-fraction 0.5 of twice the piece keeps it as /train
with open(W("b.txt"), "wb") as f:
    f.write(bytes(pieces[1].astype(np.uint8)) * 2)
run([a.bin, "prep", "--input", W("b.txt"), "--out", W("shards", "b.h5"), "--val-fraction", "0.5"])
with h5py.File(W("shards", "b.h5"), "r") as f:
    check(np.array_equal(f["train"][...], pieces[1]), "prep's shard holds the middle piece")
for name, p in zip("abc", pieces):
    write_bin(W("shards2", name + ".bin"), p, 2)
write_bin(W("whole.bin"), stream)

base = ["--model", "tiny", "--seq-len", T, "--micro-batch", 2, "--global-batch", 8,
        "--lr", 2e-3, "--warmup", 2]


def trace(run_name, np_, args, env=None):
    d = W(run_name + "_trace")
    os.makedirs(d)
    e = {"ST_DATA_TRACE": d}
    e.update(env or {})
    r = train(a, np_, base + ["--out", W(run_name)] + args, env=e)
    rows = []
    for fn in os.listdir(d):
        rows += [tuple(map(int, l.split())) for l in open(os.path.join(d, fn))]
    return r, rows


# 1. --shuffle off equals the single file
train(a, 1, base + ["--data", W("whole.bin"), "--vocab-size", 256, "--steps", 20, "--out",
                    W("whole")])
r = train(a, 1, base + ["--data", W("shards"), "--shuffle", "off", "--steps", 20, "--out",
                        W("off")])
check("in 3 shards, in order (--shuffle off)" in r.stdout, "config block names the order")
ref, got = losses(W("whole")), losses(W("off"))
check(sorted(got) == list(range(1, 21)) and got == ref,
      "--shuffle off over the 3 shards: losses equal the single file bit for bit")
r = train(a, 1, base + ["--data", W("whole.bin"), "--vocab-size", 256, "--steps", 20, "--out",
                        W("whole_auto"), "--shuffle", "auto"])
check(losses(W("whole_auto")) == ref, "--shuffle auto on one file is the file order")

# 2. shuffled epochs
STEPS = 30
streams, loss = {}, {}
for np_ in (1, 2, 4):
    r, rows = trace(f"np{np_}", np_, ["--data", W("shards"), "--steps", STEPS])
    check("shuffled (seeded, per epoch)" in r.stdout, f"np={np_}: auto shuffles 3 shards")
    check(len(rows) == STEPS * 8, f"np={np_}: {len(rows)} sequences consumed = {STEPS} x 8")
    s = {}
    for step, ep, pos, shard, seq in rows:
        if ep * N + pos in s:
            check(False, f"np={np_}: stream position {ep * N + pos} read twice")
        s[ep * N + pos] = (shard, seq, step)
    check(sorted(s) == list(range(STEPS * 8)), f"np={np_}: positions 0..{STEPS * 8 - 1} once each")
    for q, (shard, seq, step) in s.items():
        if step != q // 8 + 1:
            check(False, f"np={np_}: position {q} read in step {step}, expected {q // 8 + 1}")
    streams[np_] = s
    loss[np_] = losses(W(f"np{np_}"))

s = streams[1]
everything = sorted((i, j) for i in range(3) for j in range(NS[i]))
epochs = []
for ep in range(2):
    seqs = [s[ep * N + p][:2] for p in range(N)]
    check(sorted(seqs) == everything, f"epoch {ep}: every one of the {N} sequences exactly once")
    blocks = [seqs[0][0]] + [seqs[i][0] for i in range(1, N) if seqs[i][0] != seqs[i - 1][0]]
    check(sorted(blocks) == [0, 1, 2], f"epoch {ep}: each shard one block (order {blocks})")
    check(seqs != sorted(seqs), f"epoch {ep}: not file order")
    epochs.append(seqs)
check(epochs[0] != epochs[1], "epoch 1 is another order than epoch 0")
tail = [s[2 * N + p][:2] for p in range(STEPS * 8 - 2 * N)]
check(len(set(tail)) == len(tail), "the started epoch 2 repeats nothing")
for np_ in (2, 4):
    check(streams[np_] == s, f"np={np_}: the same stream (position -> sequence, step) as 1 rank")
    d = max(abs(loss[np_][k] - loss[1][k]) for k in loss[1])
    check(d <= 1e-5, f"np={np_}: losses within 1e-5 of 1 rank (max {d:.2g})")
_, rows = trace("noprefetch", 2, ["--data", W("shards"), "--steps", STEPS],
                env={"ST_DATA_PREFETCH": "0"})
check(losses(W("noprefetch")) == loss[2], "ST_DATA_PREFETCH=0: losses equal bit for bit")
train(a, 1, base + ["--data", W("shards2"), "--vocab-size", 256, "--steps", STEPS, "--out",
                    W("v2")])
check(losses(W("v2")) == loss[1], "version 2 (uint32) shards of the same tokens: same losses")
waits = [json.loads(l).get("data_wait_ms") for l in open(W("np2", "metrics.jsonl"))
         if '"loss"' in l]
check(all(isinstance(w, float) and w >= 0 for w in waits), "every step logs data_wait_ms")

# 3. resume mid-epoch on another rank count
_, full = trace("full", 1, ["--data", W("shards"), "--steps", 20])
train(a, 1, base + ["--data", W("shards"), "--steps", 20, "--out", W("cut"), "--stop-after", 10])
check(open(W("cut", "ckpt", "latest")).read().strip() == "step_00000010", "stopped at step 10")
shutil.copytree(W("cut"), W("cut2"))  # for --data-changed-ok below
shutil.copytree(W("shards"), W("moved"))  # the resume below reads the same shards elsewhere
before = tree_digest(W("cut"))
# a shard rewritten in place: the same size, other tokens
write_bin(W("moved", "c.bin"), pieces[2][::-1].copy())
r = train(a, 4, base + ["--data", W("moved"), "--steps", 20, "--out", W("cut")], expect_rc=4)
msg = r.stdout + r.stderr
check("c.bin changed" in msg and "--data-changed-ok" in msg, "a changed shard refuses (exit 4)")
check(tree_digest(W("cut")) == before, "the refused resume left the run directory as it was")
os.remove(W("moved", "c.bin"))
r = train(a, 4, base + ["--data", W("moved"), "--steps", 20, "--out", W("cut")], expect_rc=4)
check("read 3 shards, --data now names 2" in r.stdout + r.stderr,
      "a shard set of another count refuses (exit 4)")
check(tree_digest(W("cut")) == before, "and leaves the run directory as it was")
write_bin(W("moved", "c.bin"), pieces[2])
d = W("cut_trace")
os.makedirs(d)
train(a, 4, base + ["--data", W("moved"), "--steps", 20, "--out", W("cut")],
      env={"ST_DATA_TRACE": d})
res = sorted(tuple(map(int, l.split())) for fn in os.listdir(d) for l in open(os.path.join(d, fn)))
want = sorted(x for x in full if x[0] > 10)
check(res == want and any(x[1] == 1 for x in res),
      f"resumed on 4 ranks: steps 11-20 read the uninterrupted run's {len(want)} sequences, "
      "across the epoch boundary")
ref, got = losses(W("full")), losses(W("cut"))
dm = max(abs(got[k] - ref[k]) for k in range(11, 21))
check(dm <= 1e-5, f"resumed on 4 ranks: losses of steps 11-20 within 1e-5 (max {dm:.2g})")
# --data-changed-ok: a shard changed, resumed anyway, with a notice
write_bin(W("moved", "c.bin"), pieces[2][::-1].copy())
r = train(a, 2, base + ["--data", W("moved"), "--steps", 12, "--out", W("cut2"),
                        "--data-changed-ok"])
check("--data-changed-ok" in r.stdout, "--data-changed-ok resumes, with a notice")

# 4. bad data: exit 4, one line naming the file, nothing modified
os.makedirs(W("bad", "empty"))
open(W("bad", "empty", "README.txt"), "w").write("no tokens here\n")
os.makedirs(W("bad", "widths"))
write_bin(W("bad", "widths", "a.bin"), pieces[0])
write_bin(W("bad", "widths", "b.bin"), pieces[1], 2)
os.makedirs(W("bad", "vocab"))
shutil.copy(W("shards", "b.h5"), W("bad", "vocab", "b.h5"))
shutil.copy(W("shards", "b.h5"), W("bad", "vocab", "c.h5"))
with h5py.File(W("bad", "vocab", "c.h5"), "a") as f:
    f.attrs["vocab_size"] = np.int64(300)
os.makedirs(W("bad", "short"))
write_bin(W("bad", "short", "a.bin"), pieces[0])
write_bin(W("bad", "short", "b.bin"), pieces[1][:T])
with open(W("bad", "list.txt"), "w") as f:
    f.write(W("shards", "a.bin") + "\n# a comment\n\nmissing.bin\n")
cases = [
    (W("bad", "none_*.bin"), "matches no file", "none_*.bin"),
    (W("bad", "empty"), "holds no token files", "empty"),
    (W("bad", "widths"), "stores 32-bit tokens", "b.bin"),
    (W("bad", "vocab"), "records a 300-token vocabulary", "c.h5"),
    (W("bad", "short"), "fewer than one sequence", "b.bin"),
    ("@" + W("bad", "list.txt"), "line 4: cannot read", "missing.bin"),
]
inputs = tree_digest(W("bad")), tree_digest(W("shards"))
for spec, what, name in cases:
    r = train(a, 1, base + ["--data", spec, "--vocab-size", 256, "--steps", 2,
                            "--out", W("bad_run")], expect_rc=4)
    err = [l for l in (r.stdout + r.stderr).splitlines() if what in l]
    check(len(err) == 1 and name in err[0], f"{os.path.basename(spec)}: exit 4, '{what}' naming {name}")
check((tree_digest(W("bad")), tree_digest(W("shards"))) == inputs, "no data file was modified")
