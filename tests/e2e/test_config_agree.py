"""Ranks agree on their configuration before they train together.

An mpirun app context (`-np 1 prog ARGS : -np 1 prog OTHERARGS`) gives one
rank another flag. Before this check, another --micro-batch trained silently
with different losses, another --zero/--steps/--ckpt-every hung, and another
--dim/--seq-len corrupted the heap in the reduce-scatter. Now each case
exits non-zero within a timeout, with one message naming the flag and the
ranks, and nothing is trained (no checkpoint, no metrics).
"""
import os
import shutil
import signal
import subprocess

from common import MPIRUN_ENV, check, corpus, parse_args, run

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
other = W("other.h5")
shutil.copy(data, other)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
        "--global-batch", 24, "--val-seqs", 4, "--steps", 4, "--lr", 1e-3, "--warmup", 2,
        "--zero", 1, "--device", "cpu"]


def with_flag(args, flag, value):
    """args with flag set to value (replaced when present, else appended)."""
    args = [str(x) for x in args]
    if flag in args:
        i = args.index(flag)
        return args[:i + 1] + [str(value)] + args[i + 2:]
    return args + [flag, str(value)]


def mpirun_contexts(contexts, timeout=90, command=("train",)):
    """contexts: [(np, args), ...] or [(np, args, mpirun_options), ...] as
    one mpirun of app contexts (options such as ["-x", "VAR=1"] go before
    the program of that context)."""
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    for i, (np, args, *opts) in enumerate(contexts):
        if i:
            cmd.append(":")
        cmd += ["-np", str(np)] + (list(opts[0]) if opts else []) + [a.bin] + list(command) + \
            [str(x) for x in args]
    env = dict(os.environ, OMP_NUM_THREADS="1", **MPIRUN_ENV)  # common.py says why
    # its own process group: a hung job is killed whole, no rank left behind
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        check(False, f"{' '.join(cmd)} finished within {timeout} s (it hung)")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


# (flag, value on the odd rank out, words the message must hold)
cases = [
    ("--micro-batch", 4, ["--micro-batch differs between ranks", "2 on rank 0", "4 on rank 1"]),
    ("--zero", 2, ["--zero differs between ranks", "1 on rank 0", "2 on rank 1"]),
    ("--steps", 6, ["--steps differs between ranks", "4 on rank 0", "6 on rank 1"]),
    ("--ckpt-every", 2, ["--ckpt-every differs between ranks"]),
    ("--keep-last", 1, ["--keep-last differs between ranks", "0 on rank 0", "1 on rank 1"]),
    ("--dim", 32, ["--dim differs between ranks", "64 on rank 0", "32 on rank 1"]),
    ("--seq-len", 16, ["--seq-len differs between ranks", "32 on rank 0", "16 on rank 1"]),
    ("--data", other, ["--data differs between ranks", "other.h5 on rank 1"]),
]
for flag, value, words in cases:
    out = W("run" + flag.replace("-", "_"))
    mine = base + ["--out", out, "--resume", "none"]
    r = mpirun_contexts([(1, mine), (1, with_flag(mine, flag, value))])
    check(r.returncode == 2, f"{flag} on one rank: exit code {r.returncode} == 2")
    for w in words:
        check(w in r.stderr, f"{flag}: the message holds '{w}'")
    check(r.stderr.count("shardtrain: error") == 1, f"{flag}: exactly one error line")
    check("every rank must get the same flags" in r.stderr, f"{flag}: the message says the fix")
    check(not os.path.exists(os.path.join(out, "ckpt")) and
          not os.path.exists(os.path.join(out, "metrics.jsonl")), f"{flag}: nothing trained")

# The environment that decides how a bf16 master is kept (and so how each
# rank rounds its working weights) must match too: ST_MASTER_FP32 on one
# rank only is refused, naming it and the fix.
out = W("master_env")
mine = base + ["--out", out, "--resume", "none"]
r = mpirun_contexts([(1, mine), (1, mine, ["-x", "ST_MASTER_FP32=1"])])
check(r.returncode == 2 and "ST_MASTER_FP32 differs between ranks" in r.stderr and
      "(unset) on rank 0" in r.stderr and "1 on rank 1" in r.stderr and
      "mpirun -x ST_MASTER_FP32" in r.stderr and r.stderr.count("shardtrain: error") == 1,
      "ST_MASTER_FP32 on one rank only: exit 2, one line naming it and the fix")

# Three ranks, two groups: the ranks of each value are named as ranges.
out = W("three")
mine = base + ["--out", out, "--resume", "none"]
r = mpirun_contexts([(2, mine), (1, with_flag(mine, "--micro-batch", 4))])
check(r.returncode == 2 and "--micro-batch differs between ranks: 2 on ranks 0-1, 4 on rank 2; "
      "every rank must get the same flags" in r.stderr,
      "2 + 1 ranks: '2 on ranks 0-1, 4 on rank 2'")

# The same flags everywhere (an app context that repeats them) trains.
out = W("same")
mine = base + ["--out", out, "--resume", "none"]
r = mpirun_contexts([(1, mine), (1, mine)], timeout=300)
check(r.returncode == 0 and os.path.exists(os.path.join(out, "ckpt", "latest")),
      "identical app contexts train and save")

# On resume, a flag given on one rank only (--lr 1e-3, the default) and
# absent on the other (which then takes the checkpoint's 2e-3) parse alike
# but differ in effect: caught after the checkpoint's settings are merged.
res = W("resume")
run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
     a.bin, "train"] + [str(x) for x in with_flag(base, "--lr", 2e-3)] + ["--out", res],
    expect_rc=0)
before = sorted(os.listdir(os.path.join(res, "ckpt")))
mine = [str(x) for x in base]
i = mine.index("--lr")
mine = mine[:i] + mine[i + 2:]  # no --lr: the checkpoint's 2e-3
mine = with_flag(mine, "--steps", 6) + ["--out", res]
r = mpirun_contexts([(1, mine), (1, mine + ["--lr", "0.001"])])
check(r.returncode == 2 and "--lr differs between ranks: 0.002 on rank 0, 0.001 on "
      "rank 1" in r.stderr, "resume: --lr given on one rank only is caught after the merge")
check(sorted(os.listdir(os.path.join(res, "ckpt"))) == before, "resume: no checkpoint written")

# A parse error on one rank only: that rank's message, once, exit 2, no hang.
out = W("parse")
mine = base + ["--out", out, "--resume", "none"]
r = mpirun_contexts([(1, mine), (1, mine + ["--lr", "fast"])])
check(r.returncode == 2 and "(rank 1): --lr expects" in r.stderr and
      r.stderr.count("shardtrain: error") == 1, "a bad flag on rank 1 only: its message, once")

# bench collectives: another --max-bytes on one rank hung in the first size
# the other rank did not run; now it is named, exit 2.
bench = ["--device", "cpu", "--min-bytes", "1KiB", "--iters", 2, "--warmup", 1]
r = mpirun_contexts([(1, bench + ["--max-bytes", "4KiB"]), (1, bench + ["--max-bytes", "64KiB"])],
                    command=("bench", "collectives"))
check(r.returncode == 2 and "--max-bytes differs between ranks: 4096 on rank 0, 65536 on rank 1"
      in r.stderr, "bench collectives: another --max-bytes on one rank is named, exit 2")
