"""Nothing is allocated through the backend after setup (docs/memory.md,
"Checks"): the trainer counts the backend's allocations (ops->allocations)
when setup ends and after every step, validation and checkpoint. A CPU run
of a few steps with validations and checkpoints allocates nothing after
setup; a run made to allocate during step 3 (ST_FAULT_ALLOC) stops there
with an internal error naming the step and the allocation."""
import json
import os

from common import check, corpus, parse_args, run

a = parse_args()
data = corpus(a)
NP = 2


def cmd(out):
    args = ["--data", data, "--device", "cpu", "--layers", 2, "--heads", 5, "--dim", 40,
            "--seq-len", 24, "--micro-batch", 2, "--global-batch", 8, "--steps", 5,
            "--val-every", 2, "--ckpt-every", 2, "--val-seqs", 5, "--zero", 2, "--out", out,
            "--json"]
    return [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
            "-np", str(NP), a.bin, "train"] + [str(x) for x in args]


# 1. Steps 1-5, validations after steps 2, 4 and 5, checkpoints of 2, 4, 5.
out = os.path.join(a.work, "run")
r = run(cmd(out))
last = json.loads(r.stdout.strip().splitlines()[-1])
al = last["backend_allocations"]
check(al["setup"] == 1, f"setup makes one raw allocation, the arena ({al['setup']} allocations)")
check(al["after_setup"] == 0, "5 steps, 3 validations and 3 checkpoints allocate nothing after setup")
check(sorted(os.listdir(os.path.join(out, "ckpt"))) ==
      ["latest", "step_00000002", "step_00000004", "step_00000005"], "the checkpoints were written")
lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
check(sum("val_loss" in d for d in lines) == 3, "the validations ran")

# 2. An allocation inside step 3 fails the run there, loudly.
out = os.path.join(a.work, "fault")
r = run(cmd(out), env={"ST_FAULT_ALLOC": "3"}, expect_rc=1)
check("internal error: the cpu-fp32 backend allocated memory after setup, during step 3 "
      "(1 allocation(s), the latest: alloc of 4096 bytes)" in r.stderr,
      "an allocation in step 3 is an internal error naming the step and the allocation")
steps = [d["step"] for d in map(json.loads, open(os.path.join(out, "metrics.jsonl")))
         if "loss" in d]
check(steps == [1, 2, 3], "the run stops after step 3")
