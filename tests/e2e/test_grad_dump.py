"""--dump-grads and `shardtrain grads norms|diff`.

1. One rank, ZeRO 1, dumps at steps 2, 4, 6 with a clip that bites: the
   whole tensors read through index.h5 with h5py equal, bit for bit, the
   gradients the program computed (ST_TEST_GRAD_RAW writes them raw); the
   clipped copy is the dump times its clip factor (float32); clip_factor is
   min(1, clip / grad_norm); grad_norm equals metrics.jsonl's; the norms
   table holds every tensor's L2 norm and they add up to grad_norm.
2. Two ranks at ZeRO 2, four at ZeRO 0 and two at ZeRO 3 (the same global batch): each
   rank's file holds its shard, equal to its raw values; the dumps equal the
   one-rank dump within the losses' tolerance across rank counts
   (test_ranks_agree: fp32 sums in another order), and `grads diff --tol`
   says so with exit 0; against a run of another seed it exits 1.
3. A PATTERN dumps only the tensors it names; the norms table still lists
   every tensor, with its dumped flag.
4. Resuming from an earlier checkpoint replays steps whose dumps exist: the
   new dump replaces the old one (kept as .replaced_step_N), and the
   replayed gradients are bit-identical.
5. Bad input: --dump-grads 0, abc, 5: -> exit 2; grads norms of a run with
   no dumps, grads diff of a missing directory and of a dump missing a rank
   file (which HDF5 would read as NaN) -> exit 3.
"""
import glob
import json
import os
import shutil

import h5py
import numpy as np

from common import check, corpus, parse_args, run, train

a = parse_args()
data = corpus(a)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
        "--global-batch", 8, "--steps", 6, "--lr", 1e-3, "--warmup", 2, "--val-seqs", 8,
        "--grad-clip", 0.5, "--resume", "none"]


def dump_run(name, np_, zero, extra=(), env_extra=None):
    out = os.path.join(a.work, name)
    raw = os.path.join(a.work, name + "_raw")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(raw, ignore_errors=True)
    os.makedirs(raw)
    env = {"ST_TEST_GRAD_RAW": raw}
    env.update(env_extra or {})
    train(a, np_, base + ["--zero", zero, "--out", out, "--dump-grads", 2] + list(extra), env=env)
    return out, raw


def metrics(out):
    rows = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if "loss" in d and "grad_norm" in d:
                rows[d["step"]] = d
    return rows


def whole(step_dir, group="grads"):
    """name -> whole tensor, and the flat vector in the model's order."""
    with h5py.File(os.path.join(step_dir, "index.h5"), "r") as f:
        table = f["norms"][...]
        names = [n.decode() for n in table["name"]]
        t = {n: f[group][n][...] for n in names if n in f[group]}
        attrs = dict(f.attrs)
    return names, t, table, attrs


# 1. one rank
one, raw1 = dump_run("np1_z1", 1, 1)
steps = sorted(os.listdir(os.path.join(one, "grads")))
check(steps == ["step_00000002", "step_00000004", "step_00000006"],
      f"dumps at steps 2, 4, 6 and nothing else: {steps}")
m1 = metrics(one)
clipped_somewhere = False
for s in (2, 4, 6):
    d = os.path.join(one, "grads", f"step_{s:08d}")
    names, g, table, attrs = whole(d)
    _, gc, _, _ = whole(d, "grads_clipped")
    flat = np.concatenate([g[n].ravel() for n in names])
    rawv = np.fromfile(os.path.join(raw1, f"step_{s}_rank_0.f32"), dtype=np.float32)
    check(flat.dtype == np.float32 and flat.shape == rawv.shape and
          np.array_equal(flat.view(np.uint32), rawv.view(np.uint32)),
          f"step {s}: the dump read with h5py equals the computed gradients bit for bit "
          f"({flat.size} values)")
    clip = np.float32(attrs["clip_factor"])
    for n in names:
        check(np.array_equal(gc[n], g[n] * clip), f"step {s} {n}: clipped = grads x clip factor")
    norm = attrs["grad_norm"]
    want = m1[s]["grad_norm"]
    check(abs(norm - want) <= 1e-6 * want, f"step {s}: grad_norm {norm:.9g} = metrics' {want:.9g}")
    check(abs(attrs["clip_factor"] - min(1.0, 0.5 / norm)) <= 1e-6,
          f"step {s}: clip_factor {attrs['clip_factor']:.6g} = min(1, 0.5 / {norm:.6g})")
    clipped_somewhere |= attrs["clip_factor"] < 1
    for row in table:
        n = row["name"].decode()
        ref = float(np.sqrt(np.sum(g[n].astype(np.float64) ** 2)))
        check(abs(row["norm"] - ref) <= 1e-6 * max(ref, 1e-30) and row["dumped"] == 1,
              f"step {s} {n}: table norm {row['norm']:.9g} = ||grad|| {ref:.9g}")
    tot = float(np.sqrt(np.sum(table["norm"] ** 2)))
    check(abs(tot - norm) <= 1e-5 * norm, f"step {s}: the tensor norms add up to grad_norm")
    check(attrs["world_size"] == 1 and attrs["zero_stage"] == 1 and attrs["step"] == s,
          f"step {s}: attributes name the step, 1 rank, ZeRO 1")
check(clipped_somewhere, "--grad-clip 0.5 clipped at least one dumped step")
check(not glob.glob(os.path.join(one, "grads", ".tmp_*")), "no temporary directory is left")

# 2. two ranks at ZeRO 2, four at ZeRO 0
for name, np_, zero in (("np2_z2", 2, 2), ("np4_z0", 4, 0), ("np2_z3", 2, 3)):
    out, raw = dump_run(name, np_, zero)
    for s in (2, 4, 6):
        d = os.path.join(out, "grads", f"step_{s:08d}")
        names, g, _, attrs = whole(d)
        flat = np.concatenate([g[n].ravel() for n in names])
        parts = []
        for r in range(np_):
            with h5py.File(os.path.join(d, f"rank_{r:05d}.h5"), "r") as f:
                b, e = int(f.attrs["partition_begin"]), int(f.attrs["partition_end"])
            rv = np.fromfile(os.path.join(raw, f"step_{s}_rank_{r}.f32"), dtype=np.float32)
            check(rv.size == e - b, f"{name} step {s} rank {r}: raw shard of {e - b} values")
            parts.append(rv)
        cat = np.concatenate(parts)[:flat.size]
        check(np.array_equal(flat.view(np.uint32), cat.view(np.uint32)),
              f"{name} step {s}: every rank's shard in the dump equals what it computed")
        _, g1, _, _ = whole(os.path.join(one, "grads", f"step_{s:08d}"))
        worst = max(float(np.max(np.abs(g[n] - g1[n]))) for n in names)
        check(worst <= 1e-5, f"{name} step {s}: max |grad - 1-rank grad| = {worst:.3g} <= 1e-5")
        check(attrs["world_size"] == np_ and attrs["zero_stage"] == zero,
              f"{name} step {s}: attributes say {np_} ranks, ZeRO {zero}")
    r = run([a.bin, "grads", "diff", one, out, "--tol", "1e-4"])
    check("all within --tol" in r.stdout and "step 6" in r.stdout,
          f"grads diff 1 rank vs {name}: the latest common step (6), all within 1e-4:\n{r.stdout}")

other, _ = dump_run("seed2", 1, 1, ["--seed", 7])
r = run([a.bin, "grads", "diff", one, other, "--step", "4", "--tol", "1e-4"], expect_rc=1)
check("above --tol" in r.stdout, f"grads diff against another seed: exit 1:\n{r.stdout[-600:]}")
r = run([a.bin, "grads", "diff", os.path.join(one, "grads", "step_00000002"),
         os.path.join(one, "grads", "step_00000002"), "--json"])
rows = [json.loads(x) for x in r.stdout.splitlines()]
check(rows and all(x["rel_diff"] == 0 and x["max_abs_diff"] == 0 for x in rows),
      "a dump against itself: no difference")

# grads norms: a column per step; --json equals the table
r = run([a.bin, "grads", "norms", one])
check("grad_norm (before clip)" in r.stdout and "wte.weight" in r.stdout, "grads norms prints")
r = run([a.bin, "grads", "norms", one, "--json", "--tensors", "h.0.*"])
js = [json.loads(x) for x in r.stdout.splitlines()]
check([x["step"] for x in js] == [2, 4, 6], "grads norms --json: one line per dump")
_, _, table, _ = whole(os.path.join(one, "grads", "step_00000004"))
want = {row["name"].decode(): float(row["norm"]) for row in table}
check(all(k.startswith("h.0.") for k in js[1]["norms"]) and js[1]["norms"] and
      all(abs(v - want[k]) <= 1e-6 * max(want[k], 1e-30) for k, v in js[1]["norms"].items()),
      "grads norms --tensors 'h.0.*': only block 0, the table's norms")

# 3. PATTERN
pat, _ = dump_run("pattern", 1, 1, ["--dump-grads", "3:h.0.*,ln_f.*"])
d = os.path.join(pat, "grads", "step_00000003")
with h5py.File(os.path.join(d, "index.h5"), "r") as f:
    got = sorted(f["grads"].keys())
    table = f["norms"][...]
names = [n.decode() for n in table["name"]]
want = sorted(n for n in names if n.startswith("h.0.") or n.startswith("ln_f."))
check(got == want and len(want) < len(names), f"PATTERN dumps only {want}: {got}")
check(all(bool(row["dumped"]) == (row["name"].decode() in want) and row["norm"] > 0
          for row in table), "the norms table lists every tensor, with its dumped flag")
check(sorted(os.listdir(os.path.join(pat, "grads"))) == ["step_00000003", "step_00000006"],
      "the last --dump-grads wins: every 3 steps")

# 4. resume replays dumped steps: replaced, and equal
rep = os.path.join(a.work, "replay")
shutil.rmtree(rep, ignore_errors=True)
args = base + ["--zero", 1, "--out", rep, "--dump-grads", 1, "--ckpt-every", 2, "--steps", 4]
args[args.index("--resume") + 1] = "auto"
train(a, 1, args)
_, before, _, _ = whole(os.path.join(rep, "grads", "step_00000003"))
shutil.rmtree(os.path.join(rep, "ckpt", "step_00000004"))
os.remove(os.path.join(rep, "ckpt", "latest"))
r = train(a, 1, args)
check(os.path.isdir(os.path.join(rep, "grads", ".replaced_step_00000003")) and
      os.path.isdir(os.path.join(rep, "grads", ".replaced_step_00000004")),
      "the replayed steps' earlier dumps are kept as .replaced_step_N")
_, after, _, _ = whole(os.path.join(rep, "grads", "step_00000003"))
check(all(np.array_equal(before[n], after[n]) for n in before),
      "a resumed run's replayed step has bit-identical gradients")

# 5. bad input
for bad in ("0", "abc", "5:"):
    r = train(a, 1, base + ["--out", os.path.join(a.work, "bad"), "--dump-grads", bad],
              expect_rc=2)
    check("--dump-grads" in r.stderr, f"--dump-grads {bad}: exit 2 naming the flag")
r = run([a.bin, "grads", "norms", os.path.join(a.work, "bad")], expect_rc=3)
check("--dump-grads" in r.stderr, f"grads norms with no dumps: exit 3: {r.stderr.strip()}")
r = run([a.bin, "grads", "diff", os.path.join(a.work, "nope"), one], expect_rc=3)
check("no such directory" in r.stderr, f"grads diff of a missing directory says so: {r.stderr.strip()}")
r = run([a.bin, "grads", "diff", one, one, "--step", "3"], expect_rc=3)
check("its dumps: 2, 4, 6" in r.stderr, f"a step with no dump lists the dumps: {r.stderr.strip()}")
r = train(a, 1, base + ["--out", os.path.join(a.work, "bad"), "--dump-grads", "2:nomatch.*"],
          expect_rc=2)
check("matches no tensor" in r.stderr and not os.path.exists(os.path.join(a.work, "bad", "grads")),
      f"a PATTERN matching no tensor: exit 2 before training: {r.stderr.strip()[:200]}")
# a rank file lost: diff names it instead of comparing the NaNs HDF5 fills in
broken = os.path.join(a.work, "broken_step")
shutil.rmtree(broken, ignore_errors=True)
shutil.copytree(os.path.join(a.work, "np2_z2", "grads", "step_00000004"), broken)
os.remove(os.path.join(broken, "rank_00001.h5"))
r = run([a.bin, "grads", "diff", os.path.join(one, "grads", "step_00000004"), broken],
        expect_rc=3)
check("rank_00001.h5 is missing" in r.stderr, f"a dump missing a rank file: exit 3: {r.stderr.strip()}")
print("PASS")
