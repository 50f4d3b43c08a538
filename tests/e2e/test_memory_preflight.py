"""train's memory pre-flight on the CPU backend: with --gpu-mem below the
plan, train stops before allocating anything, with exit 6 and one message
naming the smallest change that fits; it creates no run directory and
leaves an existing run's checkpoints alone; the change it names does pass
the pre-flight and trains. Thresholds come from `shardtrain plan --json`
for the same configuration, so the test follows the plan's arithmetic
(test_memory_plan.c and test_plan.py check that arithmetic itself)."""
import json
import os

from common import check, corpus, parse_args, run, train, tree_digest

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
NP = 2
shape = ["--model", "tiny", "--seq-len", 32, "--global-batch", 16]
base = ["--data", data] + shape + ["--val-seqs", 4, "--headroom", 0]


def planned(B, rec, zero):
    """Bytes per rank `plan` gives for this run's configuration (vocab 256:
    the byte tokens prep writes)."""
    r = run([a.bin, "plan", "--device", "cpu", "--vocab-size", "256", "--ranks", str(NP),
             "--micro-batch", str(B), "--recompute", rec, "--zero", str(zero), "--json"] +
            [str(x) for x in shape])
    return json.loads(r.stdout)["bytes"]["total"]


POLICIES = ("none", "act", "selective", "full")
P = {(B, r, z): planned(B, r, z) for B in (8, 4, 2, 1) for r in POLICIES for z in (0, 1, 2)}

# A good run whose checkpoint the failing runs must leave alone.
good = W("good")
r = train(a, NP, base + ["--micro-batch", 8, "--zero", 1, "--steps", 2, "--out", good])
check("memory     planned" in r.stdout and "not checked (no --gpu-mem on the CPU)" in r.stdout,
      "without --gpu-mem the CPU run prints its plan, not checked")
ckpt_digest = tree_digest(os.path.join(good, "ckpt"))


def expect_no_fit(name, args, words):
    """Fails twice: into a fresh --out (which must not appear) and into the
    good run (whose checkpoints must not change)."""
    fresh = W("fresh_" + name.replace(" ", "_"))
    for out in (fresh, good):
        r = train(a, NP, base + args + ["--steps", 4, "--out", out], expect_rc=None)
        err = r.stderr
        check(r.returncode == 6, f"{name}: exit code {r.returncode} == 6 (ST_EXIT_MEMORY)")
        check(err.count("shardtrain: error") == 1, f"{name}: exactly one error line, from one rank")
        for w in words:
            check(w in err, f"{name}: message says '{w}'")
    check(not os.path.exists(fresh), f"{name}: no run directory created")
    check(tree_digest(os.path.join(good, "ckpt")) == ckpt_digest,
          f"{name}: the existing run's checkpoints and latest unchanged")
    return err


def mid(lo, hi):
    check(lo < hi, f"plan ordering the case relies on: {lo} < {hi}")
    return f"{(lo + hi) // 2}B"


# 1. Only the ZeRO stage: at micro-batch 8 without recompute, ZeRO 1 fits
#    where ZeRO 0 does not.
cap = mid(P[8, "none", 1], P[8, "none", 0])
err = expect_no_fit("zero", ["--micro-batch", 8, "--zero", 0, "--gpu-mem", cap],
                    ["the memory plan needs", "is usable (--gpu-mem",
                     "The smallest change that fits: --zero 0 -> 1 (plan"])
r = train(a, NP, base + ["--micro-batch", 8, "--zero", 1, "--gpu-mem", cap, "--steps", 2,
                         "--out", W("zero_fixed")])
check("fits --gpu-mem" in r.stdout, "zero: the suggested --zero 1 passes the pre-flight and trains")

# 2. Recompute: act fits at micro-batch 8 where none does not (ZeRO 1
#    kept), and is the nearest policy; where act does not fit either,
#    selective is named. The message also offers the smaller micro-batch
#    without recompute.
check(P[4, "none", 1] < P[8, "selective", 1] < P[8, "act", 1],
      "plan: micro-batch 4 without recompute is smaller, selective smaller than act")
for rec, cap in (("act", mid(P[8, "act", 1], min(P[8, "none", z] for z in (0, 1, 2)))),
                 ("selective", mid(P[8, "selective", 1],
                                   min(P[8, r, z] for r in ("none", "act") for z in (0, 1, 2))))):
    expect_no_fit(f"recompute {rec}", ["--micro-batch", 8, "--zero", 1, "--gpu-mem", cap],
                  [f"The smallest change that fits: --recompute none -> {rec} (plan",
                   "or, keeping --recompute none: --micro-batch 8 -> 4 (gradient accumulation 1 -> 2)"])
    r = train(a, NP, base + ["--micro-batch", 8, "--zero", 1, "--recompute", rec,
                             "--gpu-mem", cap, "--steps", 2, "--out", W("recompute_fixed_" + rec)])
    check("fits --gpu-mem" in r.stdout, f"recompute: --recompute {rec} passes and trains")

# 3. Micro-batch: nothing at micro-batch 8 fits, micro-batch 4 without
#    recompute at ZeRO 1 does.
least8 = min(P[8, r, z] for r in POLICIES for z in (0, 1, 2))
cap = mid(P[4, "none", 1], least8)
expect_no_fit("micro-batch", ["--micro-batch", 8, "--zero", 1, "--gpu-mem", cap],
              ["The smallest change that fits: --micro-batch 8 -> 4 (gradient accumulation 1 -> 2) "
               "(plan"])
r = train(a, NP, base + ["--micro-batch", 4, "--zero", 1, "--gpu-mem", cap, "--steps", 2,
                         "--out", W("batch_fixed")])
check("grad-accum 2" in r.stdout and "fits --gpu-mem" in r.stdout,
      "micro-batch: --micro-batch 4 (2 accumulation steps) passes and trains")

# 4. Nothing fits at all.
expect_no_fit("nothing", ["--micro-batch", 8, "--gpu-mem", "64KiB"],
              ["nothing fits: even micro-batch 1, recompute full", "more ranks"])

# 5. Bad --gpu-mem values are flag errors (2), not memory errors.
for v in ("24", "lots"):
    r = train(a, NP, base + ["--micro-batch", 8, "--gpu-mem", v, "--out", W("bad")], expect_rc=2)
    check("--gpu-mem" in r.stderr and "unit" in r.stderr, f"--gpu-mem {v}: exit 2 naming the flag")
check(not os.path.exists(W("bad")), "bad --gpu-mem: no run directory")
