"""Memory is flat across epochs, validations and checkpoints (docs/memory.md,
"Monitoring"). A CPU run of a tiny model trains 3 whole epochs of a small
corpus on 2 ranks, validating and checkpointing several times per epoch,
with --gpu-stats-every so every step carries the process's resident memory
(rss_bytes, rank 0; rss_max_bytes, the maximum over ranks). The readings at
the end of each epoch ("epoch_end": true) must agree within TOL: the CPU
backend allocates everything at setup, so what remains is the C library's
and HDF5's own bookkeeping (page-granular, settled during the first epoch's
first checkpoint). The check is shown to work: the same run with
ST_FAULT_LEAK_KIB (64 KiB leaked per step, ~2 MiB per epoch) must fail it.
Also: the monitor says once what it reports, --mem-warn-fraction warns
once per crossing, not every step, and --val-seqs 0 runs no validation."""
import json
import os
import re

from common import check, parse_args, run, train

a = parse_args()
W = lambda n: os.path.join(a.work, n)
NP = 2
TOL = 1 << 20  # 1 MiB
G, T = 16, 32

# A small corpus, so that 3 epochs are ~100 steps.
src = os.path.join(os.path.dirname(__file__), "..", "..", "data", "kjv.txt")
text = open(src).read()[:40000] if os.path.exists(src) else None
if text is None:
    import subprocess
    text = subprocess.run(["bible", "-f", "gen1:1-gen9:29"], capture_output=True, text=True,
                          check=True).stdout[:40000]
with open(W("small.txt"), "w") as f:
    f.write(text)
r = run([a.bin, "prep", "--input", W("small.txt"), "--out", W("small.h5")])
ntrain = int(re.search(r"(\d+) train", r.stdout).group(1))
per_epoch = (ntrain - 1) // (G * T)  # a step reads G*T+1 tokens; the next wraps past the end
steps = 3 * per_epoch
every = max(per_epoch // 3, 1)  # three validations and checkpoints per epoch
print(f"{ntrain} train tokens: {per_epoch} steps per epoch, {steps} steps, "
      f"validation and checkpoint every {every}")


def cmd(out, extra=()):
    return ["--data", W("small.h5"), "--model", "tiny", "--seq-len", T, "--micro-batch", 4,
            "--global-batch", G, "--zero", 1, "--steps", steps, "--val-every", every,
            "--ckpt-every", every, "--val-seqs", 8, "--gpu-stats-every", 1, "--out", out,
            "--log-every", 1000] + list(extra)


def epoch_ends(out):
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    ends = [d for d in lines if d.get("epoch_end")]
    return lines, ends


def spread(ends, key):
    v = [d[key] for d in ends]
    return max(v) - min(v)


# 1. The real run: flat.
out = W("flat")
r = train(a, NP, cmd(out))
lines, ends = epoch_ends(out)
check(lines[0]["monitor"]["nvml"] is False and "CPU backend" in lines[0]["monitor"]["source"],
      "metrics.jsonl's first line says what the monitor reports (CPU: resident memory)")
check(r.stdout.count("  monitor    ") == 1 and "CPU backend" in r.stdout,
      "the configuration block says it once")
check([d["epoch"] for d in ends] == [0, 1, 2] and ends[-1]["step"] == steps,
      f"three epochs, each end sampled (steps {[d['step'] for d in ends]})")
ckpts = sorted(x for x in os.listdir(os.path.join(out, "ckpt")) if x.startswith("step_"))
vals = sum("val_loss" in d for d in lines)
check(len(ckpts) >= 9 and vals >= 9, f"{len(ckpts)} checkpoints and {vals} validations ran")
sampled = [d for d in lines if "loss" in d]
check(all("rss_bytes" in d and "rss_max_bytes" in d for d in sampled),
      "every step carries rss_bytes and rss_max_bytes (--gpu-stats-every 1)")
for key in ("rss_bytes", "rss_max_bytes"):
    s = spread(ends, key)
    check(s <= TOL, f"{key} at the end of epochs 0, 1, 2: {[d[key] for d in ends]}, "
          f"spread {s} B <= {TOL} B")
check(r.stderr.count("shardtrain: warning") == 0, "default --mem-warn-fraction 0.9: no warning")

# 2. The check catches growth: 64 KiB leaked per step.
out = W("leak")
r = train(a, NP, cmd(out), env={"ST_FAULT_LEAK_KIB": "64"})
lines, ends = epoch_ends(out)
s = spread(ends, "rss_bytes")
check(s > TOL, f"with 64 KiB leaked per step the same check fails: spread {s} B > {TOL} B "
      f"({[d['rss_bytes'] for d in ends]})")

# 3. --mem-warn-fraction: a threshold every reading passes warns once per
#    rank (one crossing), not once per step; 0 turns it off.
out = W("warn")
r = train(a, NP, cmd(out, ["--mem-warn-fraction", "0.000001"]))
for rank in range(NP):
    n = r.stderr.count(f"shardtrain: warning (rank {rank}): resident memory")
    check(n == 1, f"rank {rank} warned {n} time(s) over {steps} sampled steps: once per crossing")
check("above --mem-warn-fraction 1e-06" in r.stderr and "the plan was" in r.stderr,
      "the warning names the threshold and the plan")
r = train(a, NP, cmd(W("nowarn"), ["--mem-warn-fraction", "0", "--steps", 3]))
check("warning" not in r.stderr and "no warning (--mem-warn-fraction 0)" in r.stdout,
      "--mem-warn-fraction 0: no warning")

# 4. --val-seqs 0 turns validation off: no validation line, no val_loss in
#    metrics.jsonl, and the end says n/a (it once printed a "val loss 0.0000"
#    over no tokens).
out = W("noval")
r = train(a, NP, cmd(out, ["--val-seqs", "0", "--steps", 3, "--val-every", 1]))
lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
check("validation off (--val-seqs 0)" in r.stdout, "the configuration block says validation is off")
check("val    step" not in r.stdout and not any("val_loss" in d and d["val_loss"] is not None
                                                for d in lines),
      "--val-seqs 0: no validation ran, none logged")
check(re.search(r"^done: step 3, train loss [0-9.]+, val loss n/a", r.stdout, re.M) is not None,
      "--val-seqs 0: the done line says val loss n/a")
