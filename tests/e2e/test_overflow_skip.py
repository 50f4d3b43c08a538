"""A step whose reduced gradients are not finite is skipped, not applied:
ST_FAULT_OVERFLOW puts an inf into the gradients at steps 3 and 4 (as an
fp16 overflow would). On the CPU (fp32, scaler disabled) both steps are
logged as skipped, the weights stay finite, the losses at step 3 and 4 are
taken on the weights after step 2, and the checkpoint records the skipped
steps. The fp16 scale back-off itself runs on the GPU (tests/gpu/)."""
import json
import math
import os

import h5py
import numpy as np

from common import check, corpus, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
common = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
          "--global-batch", 4, "--steps", 6, "--zero", 1, "--val-seqs", 8]


def train_env(env, args):
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
           "-x", "ST_FAULT_OVERFLOW", a.bin, "train", "--device", "cpu"] + [str(x) for x in args]
    return run(cmd, env=env)


train(a, 2, common + ["--out", W("clean")])
r = train_env({"ST_FAULT_OVERFLOW": "3,4"},
              common + ["--out", W("fault"), "--dump-params", W("fault.f32")])
lines = lambda d: [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in l]
clean, fault = lines(W("clean")), lines(W("fault"))
skipped = [d["step"] for d in fault if d.get("skipped")]
check(skipped == [3, 4], f"steps 3 and 4 logged as skipped (got {skipped})")
check(all(d["grad_norm"] is None for d in fault if d["step"] in (3, 4)),
      "their gradient norm is logged as null (not finite)")
check("gradients are not finite" in r.stdout, "the log says why the step was skipped")
check([d["loss"] for d in fault[:3]] == [d["loss"] for d in clean[:3]],
      "steps 1-3 have the clean run's losses (step 3 ran on the weights after step 2)")
p = np.fromfile(W("fault.f32"), dtype=np.float32)
check(p.size > 0 and bool(np.isfinite(p).all()), f"all {p.size} final weights are finite")
check(all(math.isfinite(d["loss"]) for d in fault), "every logged loss is finite")
with h5py.File(os.path.join(W("fault"), "ckpt", "step_00000006", "index.h5"), "r") as f:
    check(int(f.attrs["skipped_steps"]) == 2, "the checkpoint records 2 skipped steps")
    check(float(f.attrs["loss_scale"]) == 1.0, "and loss scale 1 (fp32: scaler disabled)")
