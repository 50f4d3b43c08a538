"""Preemption under mpirun: SIGUSR1 (as Slurm's --signal sends it, forwarded
by mpirun) makes every rank stop at the same step boundary, write a
checkpoint and exit with 75. More signals while it writes (SIGTERM and
SIGUSR1 straight to the ranks) change nothing: the checkpoint verifies, and
resuming gives the uninterrupted run's final weights bit for bit."""
import os
import signal
import subprocess
import time

from common import check, corpus, losses, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
# A model big enough that a checkpoint takes a noticeable moment.
cfg = ["--data", data, "--layers", 2, "--heads", 4, "--dim", 128, "--seq-len", 32,
       "--micro-batch", 2, "--global-batch", 4, "--steps", 400, "--log-every", 50,
       "--val-seqs", 4, "--device", "cpu"]
cfg = [str(x) for x in cfg]

train(a, 2, cfg + ["--out", W("full"), "--dump-params", W("full.f32")])

cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
       a.bin, "train"] + cfg + ["--out", W("cut")]
env = dict(os.environ, OMP_NUM_THREADS="1")
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
metrics = W("cut/metrics.jsonl")
deadline = time.time() + 60
while time.time() < deadline and (not os.path.exists(metrics) or
                                  sum(1 for _ in open(metrics)) < 20):
    time.sleep(0.05)
p.send_signal(signal.SIGUSR1)  # mpirun forwards SIGUSR1 to every rank
ranks = subprocess.run(["pgrep", "-f", f"{a.bin} train .*{W('cut')}"], capture_output=True,
                       text=True).stdout.split()
ranks = [pid for pid in ranks if int(pid) != p.pid]  # the ranks, not mpirun itself
check(len(ranks) == 2, "found both rank processes")
for _ in range(10):  # a storm of further signals while the checkpoint is written
    for pid in ranks:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                os.kill(int(pid), sig)
            except ProcessLookupError:
                pass
    time.sleep(0.01)
out, err = p.communicate(timeout=120)
if p.returncode != 75:
    print(out[-3000:], err[-3000:])
check(p.returncode == 75, f"preempted run exits 75 (got {p.returncode})")
check("preempted: SIGUSR1 received" in out, "rank 0 says why it stopped")
stopped = max(losses(W("cut")))
check(stopped < 400, f"stopped early, at step {stopped}")
latest = open(W("cut/ckpt/latest")).read().strip()
check(latest == f"step_{stopped:08d}", f"latest is the step it stopped at ({latest})")
r = run([a.bin, "ckpt", "verify", W("cut")])
check("verify: OK" in r.stdout, "the checkpoint written under signals verifies")
check(not [d for d in os.listdir(W("cut/ckpt")) if d.startswith(".tmp")], "no temporary directory left")

train(a, 2, cfg + ["--out", W("cut"), "--dump-params", W("cut.f32")])
check(open(W("cut.f32"), "rb").read() == open(W("full.f32"), "rb").read(),
      "resumed run ends with the uninterrupted run's weights, bit for bit")
