"""train --auto-fit on CPU ranks (docs/memory.md, "train --auto-fit"): the
choice is printed, applied and recorded in metrics.jsonl's first line; it
equals what `shardtrain plan --fit` chooses for the same flags (one search,
rank/memory/memory_fit.c), with the ZeRO stage kept (--auto-fit, as plan --fit
--zero Z) or chosen (--auto-fit-zero, as plan --fit without --zero); a
budget nothing fits stops with exit 6 before anything is allocated or
written; contradictory or incomplete flags are usage errors (2)."""
import json
import os

from common import check, corpus, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
NP = 2
shape = ["--model", "tiny", "--seq-len", 32, "--global-batch", 16, "--headroom", 0]


def plan_fit(budget, extra):
    r = run([a.bin, "plan", "--device", "cpu", "--vocab-size", "256", "--ranks", str(NP),
             "--fit", "--json", "--gpu-mem", budget] + [str(x) for x in shape + extra],
            expect_rc=None)
    return r.returncode, json.loads(r.stdout)


def auto_fit(name, budget, extra, flag="--auto-fit"):
    out = W(name)
    r = train(a, NP, ["--data", data, "--val-seqs", 4, "--steps", 2, "--out", out, flag,
                      "--gpu-mem", budget] + shape + extra)
    first = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())
    return r, first


def least(extra):
    """The least memory any candidate needs (a budget of 1 KiB fits nothing)."""
    rc, d = plan_fit("1KiB", extra)
    check(rc == 6 and d["fit"]["found"] is False, "plan --fit with 1 KiB: nothing fits, exit 6")
    return d["fit"]["least"]["total"]


# Budgets: roomy, tight (forces a smaller micro-batch) and one where only
# recompute fits (between the least with full recompute and the least without).
_, roomy = plan_fit("1GiB", ["--zero", 1])
tight = (least(["--zero", 1]) + roomy["fit"]["choice"]["total"]) // 2
_, none_only = plan_fit("1GiB", ["--zero", 1, "--micro-batch", 1])
rc, full_only = plan_fit("1GiB", ["--zero", 1, "--micro-batch", 1, "--recompute", "full"])
squeeze = (full_only["fit"]["choice"]["total"] + none_only["fit"]["choice"]["total"]) // 2
check(full_only["fit"]["choice"]["total"] < none_only["fit"]["choice"]["total"],
      "plan: full recompute at micro-batch 1 needs less than none")

cases = [("roomy", "1GiB", ["--zero", 1], "--auto-fit"),
         ("tight", f"{tight}B", ["--zero", 1], "--auto-fit"),
         ("squeeze", f"{squeeze}B", ["--zero", 1], "--auto-fit"),
         ("tight_zero", f"{tight}B", [], "--auto-fit-zero"),
         ("bounded", "1GiB", ["--zero", 1, "--micro-batch", 2], "--auto-fit")]
seen = set()
for name, budget, extra, flag in cases:
    rc, p = plan_fit(budget, extra)
    check(rc == 0 and p["fit"]["found"], f"{name}: plan --fit finds a choice")
    pc = p["fit"]["choice"]
    r, first = auto_fit(name, budget, extra, flag)
    fc = first["auto_fit"]["choice"]
    key = (pc["micro_batch"], pc["recompute"], pc["zero"])
    seen.add(key)
    check(fc == pc, f"{name}: train {flag} chose what plan --fit chose: micro-batch "
          f"{pc['micro_batch']} x grad-accum {pc['grad_accum']}, recompute {pc['recompute']}, "
          f"ZeRO {pc['zero']}")
    check(f"auto-fit   micro-batch {pc['micro_batch']} x grad-accum {pc['grad_accum']}, recompute "
          f"{pc['recompute']}, ZeRO {pc['zero']}" in r.stdout and "usable (--gpu-mem" in r.stdout
          and "rule: the lowest estimated step time" in r.stdout,
          f"{name}: the configuration block says the choice, the budget and the rule")
    cfg = first["memory_plan"]["config"]
    check((cfg["micro_batch"], cfg["grad_accum"], cfg["recompute"], cfg["zero"]) ==
          (pc["micro_batch"], pc["grad_accum"], pc["recompute"], pc["zero"]) and
          first["memory_plan"]["bytes"]["total"] == pc["total"],
          f"{name}: the run's memory plan is the chosen configuration's")
    check(f"batch      micro-batch {pc['micro_batch']} x grad-accum {pc['grad_accum']} x {NP} "
          "ranks" in r.stdout, f"{name}: the choice is applied to the batch layout")
    steps = [json.loads(l)["step"] for l in open(os.path.join(W(name), "metrics.jsonl"))
             if '"loss"' in l]
    check(steps == [1, 2], f"{name}: trains with it")
check(len(seen) >= 3, f"the cases exercise different choices: {sorted(seen)}")
check(any(k[1] != "none" for k in seen), "one case needs recompute")

# Nothing fits: exit 6 from one rank, before the run directory exists.
out = W("nothing")
r = train(a, NP, ["--data", data, "--out", out, "--auto-fit", "--gpu-mem", "64KiB"] + shape,
          expect_rc=6)
check(r.stderr.count("shardtrain: error") == 1 and "--auto-fit: nothing fits" in r.stderr and
      "even micro-batch 1, recompute full" in r.stderr, "too small a budget: exit 6, one message")
check(not os.path.exists(out), "too small a budget: nothing written (no run directory)")

# Usage errors.
r = train(a, NP, ["--data", data, "--out", W("u1"), "--auto-fit-zero", "--zero", 1,
                  "--gpu-mem", "1GiB"] + shape, expect_rc=2)
check("--auto-fit-zero" in r.stderr and "--zero 1" in r.stderr, "--auto-fit-zero with --zero: exit 2")
r = train(a, NP, ["--data", data, "--out", W("u2"), "--auto-fit"] + shape, expect_rc=2)
check("--auto-fit needs a memory budget" in r.stderr, "--auto-fit on the CPU without --gpu-mem: exit 2")
r = train(a, NP, ["--data", data, "--out", W("u3"), "--auto-fit", "--gpu-mem", "1GiB",
                  "--model", "tiny", "--seq-len", 32, "--global-batch", 15], expect_rc=2)
check("does not divide by 2 ranks" in r.stderr, "--auto-fit with a global batch the ranks do not "
      "divide: exit 2")
