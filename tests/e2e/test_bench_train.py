"""bench/train_scaling.sh on CPU ranks (1 and 2, tiny model): weak and strong
runs complete, every phase of a step (data, compute, exposed communication,
optimizer) is measured, efficiency is 1 at the base rank count, and
bench/plot_scaling.py draws a PNG. No timing is asserted."""
import json
import os
import subprocess
import sys

from common import check, corpus, parse_args, run

a = parse_args()
data = corpus(a)
root = os.path.join(os.path.dirname(__file__), "..", "..")
out = os.path.join(a.work, "scaling")
env = dict(os.environ, BIN=a.bin, OMP_NUM_THREADS="1",
           MPIRUN=f"{a.mpirun} --allow-run-as-root --oversubscribe --bind-to none")
r = subprocess.run(["bash", os.path.join(root, "bench", "train_scaling.sh"), out, "1,2", "--data",
                    data, "--model", "tiny", "--seq-len", "32", "--micro-batch", "2", "--steps",
                    "4", "--device", "cpu"], capture_output=True, text=True, env=env)
print(r.stdout[-3000:], r.stderr[-2000:])
check(r.returncode == 0, "bench/train_scaling.sh ran weak and strong scaling on 1 and 2 ranks")
res = json.load(open(os.path.join(out, "scaling.json")))
for mode in ("weak", "strong"):
    rows = res[mode]
    check([x["ranks"] for x in rows] == [1, 2], f"{mode}: rows for 1 and 2 ranks")
    check(rows[0]["efficiency"] == 1.0, f"{mode}: efficiency 1 at the base")
    check(all(x["tokens_per_s"] > 0 for x in rows), f"{mode}: tokens/s measured")
metrics = [json.loads(l) for l in open(os.path.join(out, "weak-2", "metrics.jsonl"))
           if '"t_step_ms"' in l]
# compute is the step's remainder, so check each measured phase is there
# and that together they do not exceed the step (compute stays positive)
check(len(metrics) == 4 and all(m["t_data_ms"] > 0 and m["t_comm_ms"] > 0 and
                                m["t_optimizer_ms"] > 0 and m["t_compute_ms"] > 0
                                for m in metrics),
      "--step-timing on 2 ranks: data, exposed communication, optimizer and compute each > 0")
one = [json.loads(l) for l in open(os.path.join(out, "strong-2", "metrics.jsonl"))
       if '"t_step_ms"' in l]
check(all(m["t_comm_ms"] < m["t_step_ms"] for m in one), "communication is part of the step")
png = os.path.join(a.work, "scaling.png")
subprocess.run([sys.executable, os.path.join(root, "bench", "plot_scaling.py"),
                os.path.join(out, "scaling.json"), png], check=True)
check(open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "bench/plot_scaling.py draws a PNG")
