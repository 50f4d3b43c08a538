"""No checkpoint is lost or silently replaced (issue 12, item 3).

- ckpt/latest missing, with an incomplete newer step directory and an
  unfinished .tmp_ save beside the good ones: --resume auto resumes from the
  newest complete one with a one-line notice naming what it skipped, and
  metrics.jsonl keeps the first invocation's lines.
- A run that would write over a complete checkpoint (--resume PATH of an
  earlier step on another rank count, --resume none with latest gone) is
  refused at start-up with exit 3; the checkpoint is byte-for-byte intact.
- A fresh start never truncates a metrics.jsonl that holds lines.
- --keep-last 2 keeps the newest two complete checkpoints and one marked
  with a file named keep, and removes the rest; every survivor verifies.
- Rank files carry the run_id of their index: a rank file of another run
  copied into a checkpoint fails verify and resume, naming the file.
- A read-only ckpt/ (a read-only tmpfs mounted on it: root ignores
  permission bits) is refused at start-up, naming the directory, before a
  step is trained.
"""
import json
import os
import shutil
import subprocess

from common import check, corpus, losses, parse_args, run, train, tree_digest

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 1,
        "--global-batch", 4, "--val-seqs", 4, "--log-every", 100]


def ckpt(d, step):
    return os.path.join(d, "ckpt", "step_%08d" % step)


def verify(path, expect_rc=0):
    return run([a.bin, "ckpt", "verify", path], expect_rc=expect_rc)


# --- latest missing: resume from the newest complete step directory -------
out = W("lost")
train(a, 2, base + ["--steps", 20, "--stop-after", 10, "--ckpt-every", 5, "--out", out])
n_before = sum(1 for _ in open(os.path.join(out, "metrics.jsonl")))
os.remove(os.path.join(out, "ckpt", "latest"))
os.makedirs(ckpt(out, 15))                               # no index.h5
shutil.copytree(ckpt(out, 10), os.path.join(out, "ckpt", ".tmp_step_00000016"))
r = train(a, 2, base + ["--steps", 20, "--ckpt-every", 5, "--out", out])
notes = [l for l in r.stdout.splitlines() if l.startswith("notice: ckpt/latest")]
check(len(notes) == 1 and "is missing" in notes[0] and "step_00000010" in notes[0] and
      "step_00000015 has no index.h5" in notes[0] and ".tmp_step_00000016 is an unfinished save"
      in notes[0], "latest missing: one notice names step 10 and what was skipped: %s" % notes)
check("resumed from" in r.stdout and "at step 10" in r.stdout and "fresh start" not in r.stdout,
      "latest missing: resumed from step 10, not a fresh start")
got = losses(out)
check(sorted(got) == list(range(1, 21)), "metrics.jsonl holds steps 1-20: both invocations")
check(sum(1 for _ in open(os.path.join(out, "metrics.jsonl"))) > n_before,
      "metrics.jsonl was appended to, not truncated")
check(open(os.path.join(out, "ckpt", "latest")).read().strip() == "step_00000020",
      "latest names step 20")
verify(out)

# --- latest names an incomplete directory: the older complete one ------------
out = W("broken")
train(a, 2, base + ["--steps", 12, "--stop-after", 8, "--ckpt-every", 4, "--out", out])
os.remove(os.path.join(ckpt(out, 8), "rank_00001.h5"))
r = train(a, 2, base + ["--steps", 12, "--ckpt-every", 4, "--out", out])
check("notice: ckpt/latest names step_00000008, which is incomplete (it is missing "
      "rank_00001.h5); resuming from the newest complete checkpoint step_00000004" in r.stdout
      and "at step 4" in r.stdout, "latest names an incomplete step 8: resumed from step 4")
kept = os.path.join(out, "ckpt", ".incomplete_step_00000008")
check(os.path.exists(os.path.join(kept, "rank_00000.h5")) and
      not os.path.exists(os.path.join(kept, "rank_00001.h5")),
      "the incomplete step 8 is kept aside as .incomplete_step_00000008, not deleted")
verify(ckpt(out, 8))
verify(out)
# only leftovers and no latest: a fresh start, saying what it passed over
out = W("leftovers")
os.makedirs(ckpt(out, 3))
r = train(a, 1, base + ["--steps", 2, "--out", out])
check("notice: ckpt/latest is missing and no step directory" in r.stdout and
      "step_00000003 has no index.h5" in r.stdout and "fresh start" in r.stdout,
      "no latest, only an incomplete directory: a fresh start with a notice")

# --- never write over a complete checkpoint --------------------------------
out = W("keepme")
train(a, 2, base + ["--steps", 8, "--ckpt-every", 4, "--out", out])
d8 = tree_digest(ckpt(out, 8))
r = train(a, 1, base + ["--steps", 8, "--ckpt-every", 4, "--out", out,
                        "--resume", ckpt(out, 4)], expect_rc=3)
trained = lambda r: any(l.startswith("step ") for l in r.stdout.splitlines())
check("step_00000008 is a complete checkpoint of a later step" in r.stderr and not trained(r),
      "--resume PATH of an earlier step on 1 rank: refused before training, naming step 8")
ours = lambda r: [l for l in r.stderr.splitlines() if l.startswith("shardtrain")]
check(len(ours(r)) == 1, "one line: %s" % ours(r))
check(tree_digest(ckpt(out, 8)) == d8, "step 8 is byte-for-byte what the 2-rank run wrote")
os.remove(os.path.join(out, "ckpt", "latest"))
r = train(a, 1, base + ["--steps", 8, "--ckpt-every", 4, "--out", out, "--resume", "none"],
          expect_rc=3)
check("step_00000008 is a complete checkpoint" in r.stderr,
      "--resume none with latest gone: refused, naming step 8")
check(tree_digest(ckpt(out, 8)) == d8, "step 8 still intact")

# --- a fresh start appends to metrics.jsonl ---------------------------------
out = W("fresh")
os.makedirs(out)
old = ['{"step":1,"loss":9.0,"note":"an earlier run"}', '{"step":2,"loss":8.0}']
open(os.path.join(out, "metrics.jsonl"), "w").write("\n".join(old) + "\n")
r = train(a, 2, base + ["--steps", 2, "--out", out])
check("fresh start" in r.stdout, "no checkpoint: a fresh start")
lines = open(os.path.join(out, "metrics.jsonl")).read().splitlines()
check(lines[:2] == old and len(lines) > 2 and "memory_plan" in json.loads(lines[2]),
      "a fresh start kept the earlier lines and appended its own")

# --- --keep-last and the keep mark ------------------------------------------
out = W("keep")
train(a, 2, base + ["--steps", 12, "--stop-after", 6, "--ckpt-every", 2, "--out", out])
open(os.path.join(ckpt(out, 2), "keep"), "w").close()
r = train(a, 2, base + ["--steps", 12, "--ckpt-every", 2, "--keep-last", 2, "--out", out])
left = sorted(n for n in os.listdir(os.path.join(out, "ckpt")) if n.startswith("step_"))
check(left == ["step_00000002", "step_00000010", "step_00000012"],
      "--keep-last 2: the newest two and the marked one remain: %s" % left)
check("checkpoint: removed step_00000004" in r.stdout and "(--keep-last 2)" in r.stdout,
      "the removals are printed")
check(not [n for n in os.listdir(os.path.join(out, "ckpt")) if n.startswith(".")],
      "nothing half-removed is left behind")
check(open(os.path.join(out, "ckpt", "latest")).read().strip() == "step_00000012",
      "latest names step 12")
for n in left:
    verify(os.path.join(out, "ckpt", n))
print("ok: every remaining checkpoint verifies")
# A resume without the flag keeps the run's --keep-last (the checkpoint's config).
r = train(a, 2, base + ["--steps", 16, "--ckpt-every", 2, "--out", out])
left = sorted(n for n in os.listdir(os.path.join(out, "ckpt")) if n.startswith("step_"))
check(left == ["step_00000002", "step_00000014", "step_00000016"],
      "a resume without --keep-last keeps the checkpoint's --keep-last 2: %s" % left)
r = train(a, 2, base + ["--keep-last", -1, "--out", W("bad")], expect_rc=2)
check("--keep-last" in r.stderr, "--keep-last -1 is a usage error")

# --- run identity: files of two runs never pass as one checkpoint -----------
x, y = W("runx"), W("runy")
train(a, 2, base + ["--steps", 4, "--out", x])
train(a, 2, base + ["--steps", 4, "--out", y, "--seed", 7])
shutil.copy(os.path.join(ckpt(y, 4), "rank_00001.h5"), os.path.join(ckpt(x, 4), "rank_00001.h5"))
r = verify(x, expect_rc=3)
check("rank_00001.h5" in r.stderr and "run_id" in r.stderr and "two runs" in r.stderr,
      "ckpt verify names the rank file of another run: " + r.stderr.strip())
r = train(a, 2, base + ["--steps", 6, "--out", x], expect_rc=3)
check("rank_00001.h5" in r.stderr and "two runs" in r.stderr,
      "resume refuses the mixed checkpoint, naming the rank file")

# --- a read-only ckpt/ is refused at start-up --------------------------------
out = W("ro")
os.makedirs(os.path.join(out, "ckpt"))
ro = os.path.join(out, "ckpt")
subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", ro], check=True)
try:
    r = train(a, 2, base + ["--steps", 4, "--out", out], expect_rc=1)
finally:
    subprocess.run(["umount", ro], check=True)
check(("directory %s is not writable" % ro) in r.stderr and "checkpoints" in r.stderr,
      "read-only ckpt/: the error names it: %s" % ours(r))
check(not trained(r) and not os.path.exists(os.path.join(out, "metrics.jsonl")),
      "nothing was trained or logged")
check(len(ours(r)) == 1, "one line: %s" % ours(r))
print("PASS")
