"""Resume continues the run that was written (issue 12, items 3 and 4).

- Settings not given on the command line come from the checkpoint's config:
  a resume that repeats no flags trains exactly as one that repeats them all.
- Each override is listed (configuration block and metrics.jsonl); a change
  of rank count is named; a moved cosine horizon is said with the lr of the
  next step under both schedules and the flag that keeps the old one.
- --stop-after at or below the checkpoint's step says --stop-after is why
  nothing trained.
- A setting that changes the function the weights compute (--heads,
  --seq-len, --model, --vocab-size) is refused (exit 3) naming the flag, and
  the checkpoint is left as it was.
- NaN and inf float flags, --heads 5 --dim 64 and --resume '' are bad flags
  (exit 2) in train and plan alike.
- The configuration block names the data file once, and a one-rank run's
  zero line does not describe collectives that do not happen.
"""
import json
import os
import shutil

from common import check, corpus, losses, parse_args, run, train, tree_digest

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
# Every setting away from its default, so a resume on defaults would show.
flags = ["--model", "tiny", "--seq-len", 32, "--micro-batch", 2, "--global-batch", 8,
         "--lr", 2e-3, "--warmup", 3, "--weight-decay", 0.05, "--beta2", 0.99, "--val-seqs", 4,
         "--ckpt-every", 3, "--seed", 7]
run_dir = W("run")
r = train(a, 1, ["--data", data, "--out", run_dir, "--steps", 6] + flags)
check(r.stdout.count(data) == 1, "the configuration block names the data file once")
zl = [l for l in r.stdout.splitlines() if l.startswith("  zero")][0]
check("one rank" in zl and "reduce-scatter gradients" not in zl,
      f"one rank: the zero line says what happens ({zl.strip()})")
digest = tree_digest(os.path.join(run_dir, "ckpt"))


def copy(name):
    d = W(name)
    shutil.copytree(run_dir, d)
    return d


def resume_line(run):
    """The metrics.jsonl line of the last invocation's setup (resume info)."""
    heads = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"memory_plan"' in l]
    return heads[-1]


# 1. No flags repeated: the checkpoint's settings, step for step the same as
#    a resume that repeats them all.
bare = copy("bare")
r = train(a, 1, ["--data", data, "--out", bare, "--steps", 9])
out = r.stdout
check("micro-batch 2 x grad-accum 4 x 1 rank = global batch 8" in out,
      "resume without flags: the checkpoint's micro-batch 2 and global batch 8, not the defaults")
check("AdamW lr 0.002 (warmup 3," in out and "wd 0.05" in out and "0.99" in out,
      "resume without flags: the checkpoint's lr, warmup, weight decay and beta2")
check("overridden on the command line: --steps 6 -> 9\n" in out,
      "resume without flags: the one override listed is --steps")
check("the cosine schedule now ends at step 9, not 6" in out and "--lr-decay-steps 6" in out,
      "--steps raised: the moved horizon is said, with --lr-decay-steps 6 to keep it")
full = copy("full")
train(a, 1, ["--data", data, "--out", full, "--steps", 9] + flags)
lb, lf = losses(bare), losses(full)
check(all(lb[s] == lf[s] for s in range(7, 10)),
      "resume without flags trains steps 7-9 exactly as a resume repeating every flag")
j = resume_line(bare)["resume"]
check(j["step"] == 6 and list(j["overrides"]) == ["--steps"] and j["schedule"]["lr_decay_steps_checkpoint"] == 6
      and j["schedule"]["lr_decay_steps_now"] == 9, "metrics.jsonl: the resume, its one override, the schedule")
sch = j["schedule"]
check(f"step 7 trains at lr {sch['lr_now']:.2e}, where the checkpoint's horizon gives "
      f"{sch['lr_checkpoint_schedule']:.2e}" in out and sch["lr_now"] > sch["lr_checkpoint_schedule"],
      "the lr of step 7 under the new and the old schedule")

# 1b. --lr-decay-steps 6 keeps the old schedule: no notice.
keep = copy("keep")
r = train(a, 1, ["--data", data, "--out", keep, "--steps", 9, "--lr-decay-steps", 6])
check("cosine schedule now ends" not in r.stdout and "cosine to 0.0002 by step 6" in r.stdout,
      "--lr-decay-steps 6: the checkpoint's horizon kept, nothing to say")

# 2. An override is listed, in the block and in metrics.jsonl.
ov = copy("override")
r = train(a, 1, ["--data", data, "--out", ov, "--steps", 9, "--lr", 1e-3])
check("overridden on the command line: --steps 6 -> 9, --lr 0.002 -> 0.001\n" in r.stdout,
      "override --lr listed")
j = resume_line(ov)["resume"]
check(j["overrides"]["--lr"] == {"checkpoint": 0.002, "now": 0.001}, "metrics.jsonl lists the override")

# 3. Another rank count is named.
two = copy("two")
r = train(a, 2, ["--data", data, "--out", two, "--steps", 9])
check("rank count 1 -> 2" in r.stdout, "a change of rank count is named")
check(resume_line(two)["resume"]["ranks"] == {"checkpoint": 1, "now": 2}, "metrics.jsonl: the rank counts")

# 4. --stop-after at the checkpoint's step: it is why nothing trained.
r = train(a, 1, ["--data", data, "--out", copy("stop"), "--steps", 9, "--stop-after", 6])
check("nothing to train: --stop-after 6 is at or below the checkpoint's step 6" in r.stdout,
      "--stop-after at the checkpoint's step is named as the reason")

# 4b. A GPU run's checkpoint (bf16 in its config; the weights are fp32 on
#     disk) resumes on the CPU without --precision: the CPU runs fp32, says so.
import h5py
gpu = copy("gpu")
idx = os.path.join(gpu, "ckpt", open(os.path.join(gpu, "ckpt", "latest")).read().strip(), "index.h5")
with h5py.File(idx, "r+") as f:
    cfg = json.loads(f.attrs["config"])
    cfg["train"]["precision"] = "bf16"
    f.attrs["config"] = json.dumps(cfg)
r = train(a, 1, ["--data", data, "--out", gpu, "--steps", 7])
check("the checkpoint trained in bf16; the CPU backend runs fp32" in r.stdout,
      "a bf16 checkpoint resumes on the CPU in fp32, with a notice")

# 5. Settings that change the function the weights compute are refused.
# The rest of the shape given too, so that only the one setting differs
# (before this check, --heads 8 with the same tensor shapes resumed silently).
tiny = ["--model", "tiny", "--seq-len", 32]
for extra, flag in ((tiny + ["--heads", 8], "--heads 8"), (["--heads", 8], "--heads 8"),
                    (["--model", "tiny", "--seq-len", 16], "--seq-len 16"),
                    (tiny + ["--vocab-size", 512], "--vocab-size 512"),
                    (["--model", "small", "--seq-len", 32], "--model small")):
    r = train(a, 1, ["--data", data, "--out", run_dir, "--steps", 9] + extra, expect_rc=None)
    check(r.returncode == 3, f"{flag} on resume: exit {r.returncode} == 3")
    check(flag in r.stderr and "differ" in r.stderr and "--model/--layers" not in r.stderr,
          f"{flag} on resume: the message names it")
    check(r.stderr.count("shardtrain: error") == 1, f"{flag}: one error line")
    check(tree_digest(os.path.join(run_dir, "ckpt")) == digest, f"{flag}: checkpoint unchanged")
# the same shape given explicitly is fine
r = train(a, 1, ["--data", data, "--out", copy("same"), "--steps", 9, "--heads", 4, "--dim", 64])
check("resumed from" in r.stdout, "the checkpoint's own --heads/--dim given again: resumes")

# 6. Non-finite float flags, an impossible shape, an empty --resume: exit 2.
base = ["--data", data, "--out", W("bad"), "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
        "--global-batch", 4]
for flag, v in (("--lr", "nan"), ("--lr", "inf"), ("--beta1", "nan"), ("--beta2", "-nan"),
                ("--eps", "nan"), ("--weight-decay", "nan"), ("--min-lr-frac", "nan"),
                ("--grad-clip", "inf"), ("--loss-scale-max", "inf"), ("--headroom", "nan"),
                ("--mem-warn-fraction", "nan"), ("--nccl-timeout", "inf")):
    r = train(a, 1, base + [flag, v], expect_rc=None)
    check(r.returncode == 2 and flag in r.stderr and "finite" in r.stderr,
          f"train {flag} {v}: exit 2 naming the flag")
r = run([a.bin, "plan", "--model", "tiny", "--headroom", "nan", "--gpu-mem", "8GiB"], expect_rc=None)
check(r.returncode == 2 and "--headroom" in r.stderr, "plan --headroom nan: exit 2")
r = train(a, 1, base + ["--heads", 5, "--dim", 64], expect_rc=None)
check(r.returncode == 2 and "--dim 64" in r.stderr, f"train --heads 5 --dim 64: exit {r.returncode} == 2")
r = run([a.bin, "plan", "--heads", "5", "--dim", "64", "--gpu-mem", "8GiB"], expect_rc=None)
check(r.returncode == 2, f"plan --heads 5 --dim 64: exit {r.returncode} == 2, as train")
r = train(a, 1, base + ["--resume", ""], expect_rc=None)
check(r.returncode == 2 and "--resume" in r.stderr and not os.path.exists(W("bad")),
      "--resume '': exit 2, nothing made")
