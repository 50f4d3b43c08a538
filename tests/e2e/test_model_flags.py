"""The architecture flags (issue 14, item 2) refused or accepted with the
documented exit codes and one line naming the flag:

- --kv-heads that does not divide --heads, an unknown --arch, --norm-eps or
  --rope-theta on a GPT-2 (LayerNorm, learned positions), --tied 2, and
  --seq-len past a family preset's positions: exit 2, in plan and (each
  place train checks them) in train;
- a family preset keeps its own vocabulary: data of a larger tokenizer
  vocabulary is refused (exit 4, naming --model), data of a smaller one is
  accepted (the run gets as far as the memory pre-flight, here told to
  fail with --gpu-mem 1MiB: exit 6, not 4);
- a resume with another --kv-heads or --arch than the checkpoint's is
  refused (exit 3) naming the flag, and leaves the checkpoint as it was;
  --kv-heads equal to the checkpoint's is no difference;
- the configuration block and the checkpoint's config carry the
  architecture.
"""
import json
import os
import shutil

import h5py

from common import check, corpus, parse_args, run, tree_digest

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)


def train(a, np, args, expect_rc=0):
    """One rank started without mpirun (an MPI singleton, as a user may):
    these runs stop in setup or after a step, and mpirun's own start would
    be most of the test's time."""
    assert np == 1
    return run([a.bin, "train"] + [str(x) for x in args] + ["--device", "cpu"],
               expect_rc=expect_rc)


def plan(args, expect_rc=0):
    return run([a.bin, "plan"] + [str(x) for x in args], expect_rc=expect_rc)


def refused(r, line, what):
    """One error line from shardtrain (mpirun adds its own after it)."""
    err = [l for l in r.stderr.splitlines() if l.startswith("shardtrain: error")]
    check(len(err) == 1 and line in err[0], f"{what}: one line with '{line}' (got {err})")
    return err[0]


# 1. Bad combinations: exit 2 in train (after the data is open) and plan.
bad = [(["--heads", 4, "--kv-heads", 3], "--kv-heads 3 must divide --heads 4"),
       (["--arch", "mistral"], "unknown --arch 'mistral'; use gpt2, llama or qwen2"),
       (["--norm-eps", "1e-6"], "--norm-eps 1e-06 is RMSNorm's epsilon, but this model (--arch "
                                "gpt2) has LayerNorm"),
       (["--model", "gpt2-124m", "--rope-theta", 10000], "--rope-theta 10000 is the base of "
                                                         "rotary positions"),
       (["--tied", 2], "--tied must be one of 0|1, got '2'"),
       (["--model", "smollm2-135m", "--seq-len", 9000],
        "--seq-len 9000 exceeds the model's 8192 positions (--model smollm2-135m)")]
# train refuses in two places: while parsing (--arch, --tied: plan's parser
# too) and once the description is final (after a resume would have merged
# the checkpoint's), which --kv-heads, --norm-eps, --rope-theta and --seq-len
# reach; each place once in train, every case in plan.
in_train = {0, 1, 2, 5}
for i, (flags, line) in enumerate(bad):
    if i in in_train:
        r = train(a, 1, ["--data", data, "--out", W("bad"), "--steps", 1] + flags, expect_rc=2)
        refused(r, line, "train " + " ".join(map(str, flags)))
    r = plan(flags, expect_rc=2)
    refused(r, line, "plan " + " ".join(map(str, flags)))
check(not os.path.exists(os.path.join(W("bad"), "ckpt")), "refused flags wrote no checkpoint")

# 2. A family preset's vocabulary: larger data refused, smaller accepted.
big = W("big_vocab.h5")
shutil.copy(data, big)
with h5py.File(big, "r+") as f:
    f.attrs["vocab_size"] = 60000
    f.attrs["tokenizer"] = b"test-60k"
    f.attrs["tokenizer_digest"] = b"ab" * 32
r = train(a, 1, ["--data", big, "--out", W("fam"), "--model", "smollm2-135m", "--seq-len", 64],
          expect_rc=4)
refused(r, "--model smollm2-135m has a vocabulary of 49152 tokens, but --data " + big +
        " holds ids of a 60000-token vocabulary", "a family preset under larger data")
# --init-from a model of a smaller vocabulary than the data's names the source, not a flag
# the user did not give.
REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
tiny = os.path.join(REPO, "tests", "data", "hf", "llama-tiny")
r = train(a, 1, ["--data", big, "--out", W("fam_init"), "--init-from", tiny, "--seq-len", 64],
          expect_rc=4)
refused(r, "--init-from " + tiny + " has a vocabulary of 300 tokens, but --data " + big +
        " holds ids of a 60000-token vocabulary", "--init-from under larger data")
r = train(a, 1, ["--data", data, "--out", W("fam"), "--model", "smollm2-135m", "--seq-len", 64,
                 "--micro-batch", 1, "--global-batch", 1, "--gpu-mem", "1MiB"], expect_rc=6)
err = [l for l in r.stderr.splitlines() if l.startswith("shardtrain: error")]
check(len(err) == 1 and "--gpu-mem" in err[0] and "vocabulary" not in err[0],
      f"byte data under smollm2-135m's 49152 tokens: past the data check to the memory "
      f"pre-flight ({err})")

# 3. Resume: the architecture is the checkpoint's.
run_dir = W("run")
flags = ["--model", "tiny", "--seq-len", 32, "--micro-batch", 2, "--global-batch", 4,
         "--ckpt-every", 1, "--kv-heads", 2, "--ffn-dim", 96]
r = train(a, 1, ["--data", data, "--out", run_dir, "--steps", 1] + flags)
check("  arch       gpt2: 2 KV heads of 16, FFN 96 GELU, LayerNorm, learned positions, biases, "
      "tied head" in r.stdout, "the configuration block names the architecture")
step = os.path.join(run_dir, "ckpt", "step_00000001")
with h5py.File(os.path.join(step, "index.h5"), "r") as f:
    cfg = json.loads(f.attrs["config"])
m = cfg["model"]
check(m["arch"] == "gpt2" and m["n_kv_head"] == 2 and m["ffn_dim"] == 96 and m["tied"] is True
      and m["norm"] == "layernorm" and m["pos"] == "learned",
      "the checkpoint's config carries the architecture")
digest = tree_digest(os.path.join(run_dir, "ckpt"))
r = train(a, 1, ["--data", data, "--out", run_dir, "--steps", 2, "--kv-heads", 4], expect_rc=3)
refused(r, "--kv-heads 4 differs from the checkpoint " + step + ", written with --kv-heads 2",
        "resume with another --kv-heads")
r = train(a, 1, ["--data", data, "--out", run_dir, "--steps", 2, "--arch", "llama"], expect_rc=3)
refused(r, "--arch llama differs from the checkpoint", "resume with another --arch")
check(tree_digest(os.path.join(run_dir, "ckpt")) == digest, "refused resumes left the checkpoint")
r = train(a, 1, ["--data", data, "--out", run_dir, "--steps", 2, "--kv-heads", 2])
check("resumed from" in r.stdout and "2 KV heads" in r.stdout,
      "resume with the checkpoint's own --kv-heads continues it")
print("PASS")
