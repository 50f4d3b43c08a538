"""An out-of-memory despite the plan (docs/memory.md, "Out of memory
anyway"), on the CPU backend through the fault injections:

(a) ST_FAULT_OOM: a run with checkpoints at steps 2 and 4 is resumed and
    one allocation inside step 6 fails, on 1 rank and on 2 ranks (there on
    rank 1 only, so rank 0 sits in a collective and must not hang). The run
    exits 7 with one report naming the step, the request, the plan, the
    free memory and a `shardtrain plan ... --fit` command; the checkpoint
    directory (latest and every file) is byte-identical afterwards; a plain
    resume then trains to the end.
(b) ST_FAULT_ARENA_SHORT: an arena one byte short of the plan stops setup
    with exit 7 naming the category that did not fit, before step 1, and
    writes nothing: no run directory for a fresh run, an existing run left
    byte-identical."""
import os
import subprocess
import sys

from common import check, corpus, parse_args, tree_digest

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--device", "cpu", "--model", "tiny", "--seq-len", 32,
        "--micro-batch", 4, "--global-batch", 8, "--ckpt-every", 2, "--val-every", 2,
        "--val-seqs", 4, "--zero", 1]


def train(np, args, env=None, rc=0):
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    xs = sum((["-x", k] for k in (env or {})), [])
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(np)] + xs + [a.bin, "train"] + [str(x) for x in base + args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=180)
    except subprocess.TimeoutExpired:
        sys.exit(f"FAIL: {' '.join(cmd)} hung (a rank waited for one that ran out of memory)")
    if r.returncode != rc:
        print("command:", " ".join(cmd), "\nstdout:", r.stdout[-4000:], "\nstderr:", r.stderr[-4000:])
        sys.exit(f"FAIL: exit code {r.returncode}, expected {rc}")
    return r


# (a) out of memory inside step 6 of a resumed run
for np, fault in ((1, "6"), (2, "1:6")):
    out = W(f"run{np}")
    train(np, ["--steps", 4, "--out", out])
    ckpt = os.path.join(out, "ckpt")
    before = tree_digest(ckpt)
    latest = open(os.path.join(ckpt, "latest")).read().strip()
    check(latest == "step_00000004", f"{np} rank(s): the first run's latest is step 4")

    r = train(np, ["--steps", 8, "--out", out], env={"ST_FAULT_OOM": fault}, rc=7)
    err = r.stderr
    rank = 0 if np == 1 else 1
    check("out of memory at run time despite the plan, during step 6 (exit code 7)" in err,
          f"{np} rank(s): exit 7 and the report names step 6")
    check(err.count("out of memory at run time") == 1, f"{np} rank(s): one report")
    check(f"(rank {rank})" in err, f"{np} rank(s): the report names rank {rank}")
    for field, what in (("requested   ", "the request"),
                        ("ST_FAULT_OOM: an allocation inside the step", "what failed"),
                        ("planned     ", "the plan"), ("per rank in all: the arena", "the arena"),
                        ("free of", "free and total memory"), ("/proc/meminfo", "its source"),
                        ("still names step_00000004, untouched", "the latest checkpoint"),
                        ("shardtrain plan --layers 2", "a plan command"), ("--fit", "--fit")):
        check(field in err, f"{np} rank(s): the report gives {what}")
    check(tree_digest(ckpt) == before, f"{np} rank(s): ckpt/ (latest and every file) unchanged")
    check(not any(n.startswith("step_00000006") or ".tmp" in n for n in os.listdir(ckpt)),
          f"{np} rank(s): no partial checkpoint of step 6")

    r = train(np, ["--steps", 8, "--out", out])
    check("resumed from" in r.stdout and "step_00000004" in r.stdout and "done: step 8" in r.stdout,
          f"{np} rank(s): a plain resume from step 4 trains to step 8")
    check(open(os.path.join(ckpt, "latest")).read().strip() == "step_00000008",
          f"{np} rank(s): latest is then step 8")

# (b) an arena one byte short: the last buffer carved (the token buffers) does not fit
fresh = W("short")
r = train(2, ["--steps", 4, "--out", fresh], env={"ST_FAULT_ARENA_SHORT": "1"}, rc=7)
err = r.stderr
check("out of memory at run time despite the plan, during setup, before the first step" in err,
      "short arena: exit 7 at setup")
check("for tokens: a buffer of this category did not fit in the arena" in err and
      "planned     1 KiB for tokens" in err, "short arena: names the category and its plan")
check("made 1 bytes short by ST_FAULT_ARENA_SHORT" in err, "short arena: says it was made short")
check("step " not in r.stdout, "short arena: no step ran")
check(not os.path.exists(fresh), "short arena: no run directory was created")

out = W("run2")
before = tree_digest(out)
r = train(2, ["--steps", 8, "--out", out], env={"ST_FAULT_ARENA_SHORT": "1"}, rc=7)
check("during setup, before the first step" in r.stderr and "for tokens" in r.stderr,
      "short arena on resume: exit 7 at setup")
check(tree_digest(out) == before, "short arena on resume: the run directory is untouched")
