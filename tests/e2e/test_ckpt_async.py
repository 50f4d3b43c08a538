"""--ckpt-async on (the default): a save's rank files are written by a
background thread while training goes on; latest moves only after every
rank has flushed.

1. Two ranks, checkpoints every 2 steps: the async run's checkpoints are
   bit-identical to --ckpt-async off's (params, adam_m, adam_v) and the
   losses are the same; the configuration block says which ran; the plan
   has the host staging entry (3 x (shard + 1) fp32).
2. Resume: stop at step 4 with an async checkpoint, resume to step 8: the
   losses and final weights equal the uninterrupted run's bit for bit.
3. kill -9 mid-write: the save of step 4 is slowed (ST_FAULT_CKPT_SLOW);
   training runs on past step 4 while .tmp_step_00000004 is being written
   (the write is in the background), then the job is killed: latest still
   names step 2, nothing named step_00000004 exists, verify passes, and
   --resume auto continues from step 2.
4. Preemption with a save in flight: SIGUSR1 while step 4's slowed write
   runs: exit 75 only after it is finished and the current step saved;
   both are complete and latest names the newer.
"""
import json
import os
import shutil
import signal
import subprocess
import time

import h5py
import numpy as np

from common import check, corpus, losses, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
        "--global-batch", 8, "--lr", 1e-3, "--warmup", 2, "--val-seqs", 8, "--device", "cpu"]
base = [str(x) for x in base]


def fresh(name):
    shutil.rmtree(W(name), ignore_errors=True)
    return W(name)


def ckpt_arrays(step_dir):
    with h5py.File(os.path.join(step_dir, "index.h5"), "r") as f:
        return {f"{g}/{n}": f[g][n][...] for g in ("params", "adam_m", "adam_v") for n in f[g]}


# 1. async against sync
runs = {}
for mode in ("on", "off"):
    out = fresh(f"mode_{mode}")
    r = train(a, 2, base + ["--steps", 6, "--ckpt-every", 2, "--out", out, "--ckpt-async", mode])
    runs[mode] = out
    word = "asynchronous" if mode == "on" else "synchronous (--ckpt-async off)"
    check(f"checkpoint saves {word}" in r.stdout, f"--ckpt-async {mode}: the configuration "
          f"block says {word}")
    names = sorted(os.listdir(os.path.join(out, "ckpt")))
    check(names == ["latest", "step_00000002", "step_00000004", "step_00000006"],
          f"--ckpt-async {mode}: checkpoints 2, 4, 6 and latest, nothing temporary: {names}")
    check(open(os.path.join(out, "ckpt", "latest")).read().strip() == "step_00000006",
          f"--ckpt-async {mode}: latest names step 6")
check(losses(runs["on"]) == losses(runs["off"]), "the same losses with and without async saves")
for s in (2, 4, 6):
    x = ckpt_arrays(os.path.join(runs["on"], "ckpt", f"step_{s:08d}"))
    y = ckpt_arrays(os.path.join(runs["off"], "ckpt", f"step_{s:08d}"))
    check(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x),
          f"step {s}: the async checkpoint equals the synchronous one bit for bit "
          f"({len(x)} datasets)")
run([a.bin, "ckpt", "verify", runs["on"]])
plan = json.loads(run([a.bin, "plan", "--model", "tiny", "--seq-len", "32", "--micro-batch",
                       "2", "--ranks", "2", "--device", "cpu", "--json"]).stdout)
shard = plan["model"]["shard"] if "shard" in plan.get("model", {}) else None
got = plan["host_ckpt_staging"]
if shard is not None:
    check(got == 3 * (shard + 1) * 4, f"plan: host staging 3 x (shard + 1) x 4 = {got}")
check(got > 0, f"plan --json has host_ckpt_staging ({got} bytes)")
off = json.loads(run([a.bin, "plan", "--model", "tiny", "--seq-len", "32", "--micro-batch",
                      "2", "--ranks", "2", "--device", "cpu", "--json", "--ckpt-async",
                      "off"]).stdout)
check(off["host_ckpt_staging"] == 0, "plan --ckpt-async off: no host staging")

# 2. resume from an async checkpoint
full = fresh("full8")
train(a, 2, base + ["--steps", 8, "--ckpt-every", 2, "--out", full, "--dump-params",
                    W("full8.f32")])
cut = fresh("cut8")
train(a, 2, base + ["--steps", 8, "--ckpt-every", 2, "--stop-after", 4, "--out", cut])
check(open(os.path.join(cut, "ckpt", "latest")).read().strip() == "step_00000004",
      "stopped after step 4 with its async checkpoint as latest")
train(a, 2, base + ["--steps", 8, "--ckpt-every", 2, "--out", cut, "--dump-params",
                    W("cut8.f32")])
lf, lc = losses(full), losses(cut)
check(all(lc[s] == lf[s] for s in range(5, 9)), "resumed steps 5-8 have the uninterrupted losses")
check(np.array_equal(np.fromfile(W("full8.f32"), np.float32), np.fromfile(W("cut8.f32"), np.float32)),
      "resumed run's final weights equal the uninterrupted run's bit for bit")


# 3. kill -9 while the save of step 4 is written
def start(out, slow):
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
           a.bin, "train"] + base + ["--steps", "100000", "--ckpt-every", "2", "--out", out]
    env = dict(os.environ, OMP_NUM_THREADS="1", ST_FAULT_CKPT_SLOW=slow)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


def logged_steps(out):
    try:
        return max(losses(out), default=0)
    except (OSError, ValueError):
        return 0


kill = fresh("kill")
p = start(kill, "600:4")
tmp = os.path.join(kill, "ckpt", ".tmp_step_00000004")
deadline = time.time() + 120
while time.time() < deadline and not (os.path.isdir(tmp) and logged_steps(kill) >= 5):
    time.sleep(0.05)
during = logged_steps(kill)
check(os.path.isdir(tmp) and during >= 5,
      f"training went on to step {during} while step 4's checkpoint was being written")
check(open(os.path.join(kill, "ckpt", "latest")).read().strip() == "step_00000002",
      "while it is written, latest names step 2")
os.killpg(p.pid, signal.SIGKILL)
p.communicate(timeout=60)
check(open(os.path.join(kill, "ckpt", "latest")).read().strip() == "step_00000002",
      "after kill -9 mid-write: latest still names step 2")
check(not os.path.exists(os.path.join(kill, "ckpt", "step_00000004")),
      "no step_00000004 (only its temporary directory)")
run([a.bin, "ckpt", "verify", kill])
r = train(a, 2, base + ["--steps", 3, "--out", kill, "--ckpt-async", "off"])
check("step_00000002" in r.stdout and logged_steps(kill) >= 3,
      "--resume auto continues from step 2")

# 4. SIGUSR1 with a save in flight
pre = fresh("preempt")
p = start(pre, "3:4")
tmp = os.path.join(pre, "ckpt", ".tmp_step_00000004")
deadline = time.time() + 120
while time.time() < deadline and not os.path.isdir(tmp):
    time.sleep(0.02)
check(os.path.isdir(tmp), "step 4's save is in flight")
p.send_signal(signal.SIGUSR1)
out, err = p.communicate(timeout=120)
check(p.returncode == 75, f"preempted with a save in flight: exit 75 (got {p.returncode}): "
      f"{err[-500:]}")
latest = open(os.path.join(pre, "ckpt", "latest")).read().strip()
names = sorted(n for n in os.listdir(os.path.join(pre, "ckpt")) if n.startswith("step_"))
check("step_00000004" in names and latest == names[-1] and latest >= "step_00000004",
      f"step 4 finished and the current step saved as latest: {names}, latest {latest}")
check(not [n for n in os.listdir(os.path.join(pre, "ckpt")) if n.startswith(".tmp")],
      "nothing temporary left")
run([a.bin, "ckpt", "verify", pre])
print("PASS")
