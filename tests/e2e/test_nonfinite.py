"""Non-finite weights never become `latest`, and `ckpt verify` finds them.

1. A run whose weights turn NaN (ST_FAULT_NAN_STEP poisons one weight of
   rank 1 after step 4's update, as divergence would: fp32 steps with
   non-finite gradients are skipped, so no flag value gets there by itself)
   exits 1 at the save of step 4 with one line naming the tensor; step 4 is
   not written, `latest` still names step 2, which verifies.
2. A checkpoint holding a NaN weight or an inf Adam moment (written into a
   rank file with h5py, which recomputes the chunk's Fletcher-32 sum, so only
   the value check can see it): `ckpt verify` exits 3 naming the rank file,
   the dataset and the count; a resume from it is refused the same way.
"""
import os
import shutil

import h5py
import numpy as np

from common import check, corpus, parse_args, run

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 1,
        "--global-batch", 2, "--steps", 6, "--ckpt-every", 2, "--val-seqs", 4]


def mpirun(np_, args, env=None):
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--quiet",
           "-np", str(np_), "-x", "ST_FAULT_NAN_STEP", a.bin, "train", "--device", "cpu"]
    return run(cmd + [str(x) for x in args], env=env, expect_rc=None)


def ours(stderr):
    return [l for l in stderr.splitlines() if l.startswith("shardtrain")]


# 1. the save refuses NaN weights
out = W("diverged")
r = mpirun(2, base + ["--out", out], env={"ST_FAULT_NAN_STEP": "1:4"})
print(r.stdout[-1500:], r.stderr)
check(r.returncode == 1, f"NaN weights at a save: exit 1 (got {r.returncode})")
lines = ours(r.stderr)
check(len(lines) == 1, f"one shardtrain line on stderr (got {len(lines)})")
msg = lines[0] if lines else ""
check("NaN or inf" in msg and "params/" in msg and "step 4" in msg,
      "the line says NaN/inf, names the tensor and the step")
check("not written" in msg and "latest still names step_00000002" in msg,
      "the line says the checkpoint was not written and latest stays")
ck = os.path.join(out, "ckpt")
check(open(os.path.join(ck, "latest")).read().strip() == "step_00000002", "latest is step 2")
check(sorted(os.listdir(ck)) == ["latest", "step_00000002"], f"nothing else in ckpt/: {os.listdir(ck)}")
v = run([a.bin, "ckpt", "verify", out], expect_rc=None)
check(v.returncode == 0 and "verify: OK" in v.stdout, "step 2 verifies")

# 2. verify and resume on a checkpoint holding non-finite values
good = os.path.join(ck, "step_00000002")
for case, fname, group, value in (("NaN weight", "rank_00001.h5", "params", np.nan),
                                  ("inf Adam moment", "rank_00000.h5", "adam_v", np.inf)):
    bad = W("bad_" + group)
    shutil.copytree(good, bad)
    with h5py.File(os.path.join(bad, fname), "r+") as f:
        name = sorted(f[group])[0]
        d = f[group][name]
        d[3] = value  # HDF5 rewrites the chunk and its Fletcher-32 sum
        total = d.size
    want = f"{fname} dataset /{group}/{name} has 1 NaN or inf of {total}"
    v = run([a.bin, "ckpt", "verify", bad], expect_rc=None)
    print(v.stderr)
    check(v.returncode == 3, f"{case}: ckpt verify exits 3 (got {v.returncode})")
    check(want in v.stderr and "non-finite" in v.stderr,
          f"{case}: verify names the rank file, dataset and count ({want})")
    check("verify: OK" not in v.stdout, f"{case}: verify does not say OK")
    r = mpirun(2, base + ["--out", W("resume_" + group), "--resume", bad])
    check(r.returncode == 3 and want in r.stderr,
          f"{case}: a resume from it exits 3 with the same finding (rc {r.returncode})")
