"""train --grad-dtype bf16: ZeRO 2/3's reduced gradient shard kept in bf16
(one micro-step a step), on the CPU backend and MPI ranks.

1. Exactness at the first step, where both runs hold the same weights: on
   1, 2 and 3 ranks, at ZeRO 2 and 3, the bf16 run's gradients (as the
   program computed them: ST_TEST_GRAD_RAW) are the fp32 run's rounded to
   nearest even, bit for bit; the dump read with h5py holds the same values;
   metrics' grad_norm is their norm.
2. Training: ZeRO 2 and ZeRO 3 with bf16 gradients are bit-identical (every
   loss, the final weights) on 1, 2 and 3 ranks; against fp32 gradients the
   losses stay within 1e-2 but the weights differ (the rounding is real);
   --offload optimizer on 2 ranks is bit-identical to the optimizer on the
   "device" (the host AdamW reads the same bf16 bits); an inf planted in
   the bf16 shard (ST_FAULT_OVERFLOW) skips the step.
3. Resume: 3 steps, then 3 more from the checkpoint, equal the 6-step run
   bit for bit, and the resumed run keeps --grad-dtype bf16 from the
   checkpoint's config without the flag; resuming with --grad-dtype fp32 is
   allowed and said (gradients are not checkpointed state).
4. Bad input, exit 2 with the fix in one line: --zero 1, gradient
   accumulation, an unknown dtype; plan says the same, and plan's shard row
   is bf16 (2 bytes a parameter, as allocated: the run's arena would not
   fit otherwise); plan --fit and train --auto-fit-zero with --grad-dtype
   bf16 keep to ZeRO 2/3 at one micro-step.
"""
import json
import os
import shutil

import h5py
import numpy as np

from common import check, corpus, losses, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--lr", 1e-3, "--warmup", 2,
        "--val-seqs", 8, "--grad-clip", 0.5, "--resume", "none"]


def bf16_rne(x):
    """float32 array -> its bf16 rounding (nearest even), as float32."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def run_dir(name, np_, args, env=None):
    out = W(name)
    shutil.rmtree(out, ignore_errors=True)
    train(a, np_, base + ["--out", out] + [str(x) for x in args], env=env)
    return out


def raw_grads(raw, step, np_):
    return np.concatenate([np.fromfile(os.path.join(raw, f"step_{step}_rank_{r}.f32"),
                                       dtype=np.float32) for r in range(np_)])


def grad_norms(out):
    rows = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        d = json.loads(line)
        if "grad_norm" in d:
            rows[d["step"]] = d["grad_norm"]
    return rows


# 1. the first step's gradients are the fp32 ones rounded, bit for bit
for np_ in (1, 2, 3):
    gb = 2 * np_
    for zero in (2, 3):
        got = {}
        for gd in ("fp32", "bf16"):
            raw = W(f"raw_{np_}_{zero}_{gd}")
            shutil.rmtree(raw, ignore_errors=True)
            os.makedirs(raw)
            out = run_dir(f"first_{np_}_{zero}_{gd}", np_,
                          ["--micro-batch", 2, "--global-batch", gb, "--steps", 1, "--zero", zero,
                           "--grad-dtype", gd, "--dump-grads", 1],
                          env={"ST_TEST_GRAD_RAW": raw})
            got[gd] = (raw_grads(raw, 1, np_), out)
        g32, g16 = got["fp32"][0], got["bf16"][0]
        want = bf16_rne(g32)
        check(g16.shape == g32.shape and np.array_equal(g16.view(np.uint32), want.view(np.uint32)),
              f"{np_} rank(s), ZeRO {zero}: step 1's bf16 gradients are the fp32 ones rounded to "
              f"nearest even, bit for bit ({g16.size} values, "
              f"{int(np.sum(g16 != g32))} changed by the rounding)")
        check(int(np.sum(g16 != g32)) > g16.size // 2, "the rounding changed most values")
        d = os.path.join(got["bf16"][1], "grads", "step_00000001")
        with h5py.File(os.path.join(d, "index.h5"), "r") as f:
            names = [n.decode() for n in f["norms"]["name"]]
            flat = np.concatenate([f["grads"][n][...].ravel() for n in names])
        check(np.array_equal(flat.view(np.uint32), g16.view(np.uint32)),
              f"{np_} rank(s), ZeRO {zero}: the dump holds the bf16 values")
        norm = grad_norms(got["bf16"][1])[1]
        ref = float(np.sqrt(np.sum(g16.astype(np.float64) ** 2)))
        check(abs(norm - ref) <= 1e-6 * ref, f"grad_norm {norm:.9g} is the bf16 values' {ref:.9g}")

# 2. ZeRO 2 = ZeRO 3 bit for bit; close to fp32 but not equal; offload equal
train_args = lambda np_, zero, gd, steps=6: ["--micro-batch", 2, "--global-batch", 2 * np_,
                                              "--steps", steps, "--zero", zero,
                                              "--grad-dtype", gd, "--val-every", 3]
for np_ in (1, 2, 3):
    runs = {}
    for zero, gd in ((2, "bf16"), (3, "bf16"), (2, "fp32")):
        name = f"train_{np_}_{zero}_{gd}"
        out = run_dir(name, np_, train_args(np_, zero, gd) +
                      ["--dump-params", W(name + ".params")])
        runs[(zero, gd)] = (losses(out), open(W(name + ".params"), "rb").read())
    l2, p2 = runs[(2, "bf16")]
    l3, p3 = runs[(3, "bf16")]
    l32, p32 = runs[(2, "fp32")]
    check(len(l2) == 6 and l2 == l3 and p2 == p3,
          f"{np_} rank(s): bf16 gradients at ZeRO 2 and 3 give the same losses and weights")
    dmax = max(abs(l2[s] - l32[s]) for s in l32)
    check(dmax <= 1e-3 and p2 != p32,
          f"{np_} rank(s): against fp32 gradients max |loss diff| {dmax:.3g} <= 1e-3, and the "
          f"weights differ")
    if np_ == 2:
        env = {"ST_OFFLOAD_CHUNK": "1000"}
        out = run_dir("offload_2", 2, train_args(2, 2, "bf16") +
                      ["--offload", "optimizer", "--dump-params", W("offload_2.params")], env=env)
        check(losses(out) == l2 and open(W("offload_2.params"), "rb").read() == p2,
              "2 ranks: --offload optimizer with bf16 gradients = the optimizer on the device")

# an inf in the bf16 shard (ST_FAULT_OVERFLOW) makes the norm non-finite and
# the step is skipped, as with fp32 gradients
for gd in ("fp32", "bf16"):
    out = run_dir(f"skip_{gd}", 2, train_args(2, 2, gd, steps=3),
                  env={"ST_FAULT_OVERFLOW": "2"})
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    check([d["step"] for d in rows if d.get("skipped")] == [2],
          f"--grad-dtype {gd}: an inf in the reduced gradients skips step 2")

# 3. resume keeps the dtype and is bit-exact
whole = run_dir("whole", 2, train_args(2, 2, "bf16") + ["--dump-params", W("whole.params")])
part = W("part")
shutil.rmtree(part, ignore_errors=True)
train(a, 2, base + ["--out", part] + [str(x) for x in train_args(2, 2, "bf16")] +
      ["--stop-after", "3", "--ckpt-every", "3"])
args = ["--data", data, "--out", part, "--resume", "auto", "--device", "cpu",
        "--dump-params", W("resumed.params")]
r = run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
         a.bin, "train"] + args)
check("gradients  bf16 shard" in r.stdout,
      "the resumed run keeps --grad-dtype bf16 from the checkpoint's config")
with h5py.File(os.path.join(part, "ckpt", "step_00000003", "index.h5"), "r") as f:
    cfg = json.loads(f.attrs["config"])["train"]
check(cfg["grad_dtype"] == "bf16" and cfg["master"] == "weights",
      "the checkpoint's config names the gradient dtype and how the master was kept (fp32: the "
      "weights themselves)")
check(losses(part) == losses(whole) and
      open(W("resumed.params"), "rb").read() == open(W("whole.params"), "rb").read(),
      "3 + 3 resumed steps = 6 steps, bit for bit")
r = run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
         a.bin, "train", "--data", data, "--out", part, "--resume", "auto", "--device", "cpu",
         "--steps", "8", "--grad-dtype", "fp32"])
check("--grad-dtype \"bf16\" -> \"fp32\"" in r.stdout and "gradients  bf16" not in r.stdout,
      "resuming with --grad-dtype fp32 is allowed and said")

# a resume on another rank count inherits bf16 and would accumulate: the
# refusal says the setting is the checkpoint's and names --grad-dtype fp32
r = run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1",
         a.bin, "train", "--data", data, "--out", whole, "--resume", "auto", "--device", "cpu",
         "--steps", "9"], expect_rc=2)
check("(the checkpoint's)" in r.stderr and "--grad-dtype fp32" in r.stderr,
      "resuming a bf16 run on 1 rank of 2 (accumulation): the refusal names the checkpoint's "
      "setting and --grad-dtype fp32")

# 4. bad input
for extra, say in ((["--zero", 1], "add --zero 2"),
                   (["--zero", 2, "--global-batch", 4], "one micro-step a step"),
                   (["--zero", 2, "--grad-dtype", "fp8"], "--grad-dtype")):
    args = ["--micro-batch", 2, "--global-batch", 2, "--steps", 1, "--grad-dtype", "bf16"]
    r = train(a, 1, base + ["--out", W("bad")] + args + extra, expect_rc=2)
    lines = [l for l in r.stderr.splitlines() if l.startswith("shardtrain: error")]
    check(len(lines) == 1 and say in lines[0],
          f"{extra}: exit 2 and one line naming the fix: {lines}")
    check(not os.path.exists(os.path.join(W("bad"), "ckpt")), f"{extra}: nothing written")
# train --auto-fit-zero with bf16 gradients: only ZeRO 2/3 at one micro-step
r = train(a, 2, base + ["--out", W("fit"), "--global-batch", 8, "--steps", 2, "--auto-fit-zero",
                        "--gpu-mem", "1GiB", "--grad-dtype", "bf16"])
check("micro-batch 4 x grad-accum 1" in r.stdout and "ZeRO 2" in r.stdout and
      "gradients  bf16 shard" in r.stdout,
      "--auto-fit-zero --grad-dtype bf16 chooses one micro-step at ZeRO 2 and keeps bf16")
r = train(a, 1, base + ["--out", W("fit1"), "--global-batch", 4, "--steps", 1, "--auto-fit",
                        "--gpu-mem", "1GiB", "--grad-dtype", "bf16", "--zero", 1], expect_rc=2)
check("add --zero 2" in r.stderr, "--auto-fit keeps --zero 1 as given, so bf16 is refused (exit 2)")
r = run([a.bin, "plan", "--device", "cpu", "--model", "tiny", "--seq-len", "32", "--micro-batch",
         "2", "--global-batch", "4", "--zero", "2", "--grad-dtype", "bf16"], expect_rc=2)
check("one micro-step a step" in r.stderr and "2 micro-steps" in r.stderr,
      "plan refuses accumulation with bf16 gradients")
check("checkpoint's" not in r.stderr,
      "plan: the flag was given and plan reads no checkpoint, so the refusal does not call "
      "the setting the checkpoint's")
r = run([a.bin, "plan", "--device", "cpu", "--model", "tiny", "--seq-len", "32", "--micro-batch",
         "2", "--global-batch", "2", "--grad-dtype", "bf16"], expect_rc=2)
check("--zero 1 (the default)" in r.stderr and "checkpoint's" not in r.stderr,
      "plan: bf16 at the default ZeRO stage names --zero as the default, not the setting as "
      "the checkpoint's")
r = run([a.bin, "plan", "--device", "cpu", "--model", "tiny", "--seq-len", "32", "--micro-batch",
         "2", "--global-batch", "2", "--zero", "2", "--grad-dtype", "bf16"])
check("ZeRO 2, precision fp32, gradient shard bf16, recompute none" in r.stdout,
      "plan's config line names the gradient shard's dtype apart from the precision")
r = run([a.bin, "plan", "--device", "cpu", "--model", "tiny", "--seq-len", "32", "--micro-batch",
         "2", "--global-batch", "9", "--ranks", "2", "--zero", "2", "--grad-dtype", "bf16"],
        expect_rc=2)
check("does not divide" in r.stderr, "plan: a global batch that does not divide says that first")


def plan_json(*extra):
    r = run([a.bin, "plan", "--device", "cpu", "--model", "gpt2-124m", "--seq-len", "1024",
             "--json"] + [str(x) for x in extra])
    return json.loads(r.stdout)


p16 = plan_json("--micro-batch", 4, "--global-batch", 4, "--zero", 2, "--grad-dtype", "bf16")
p32 = plan_json("--micro-batch", 4, "--global-batch", 4, "--zero", 2)
b16, b32 = p16["bytes"]["grad_shard"], p32["bytes"]["grad_shard"]
check(p16["config"]["grad_dtype"] == "bf16" and p32["config"]["grad_dtype"] == "fp32",
      "plan --json names the gradient dtype")
check(b16 == (2 * b32 // 4 + 255) // 256 * 256,
      f"plan: the bf16 shard takes 2 bytes a parameter ({b16} against {b32} bytes)")
check(p32["bytes"]["total"] - p16["bytes"]["total"] == b32 - b16,
      "plan: the total falls by exactly that")
r = run([a.bin, "plan", "--device", "cpu", "--model", "gpt2-124m", "--seq-len", "1024",
         "--global-batch", "8", "--micro-batch", "8", "--gpu-mem", "80GiB", "--fit",
         "--grad-dtype", "bf16"])
check("--zero 2 --grad-dtype bf16" in r.stdout or "--zero 3 --grad-dtype bf16" in r.stdout,
      "plan --fit --grad-dtype bf16 chooses ZeRO 2 or 3 at one micro-step")
print("PASS")
