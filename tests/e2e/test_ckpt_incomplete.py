"""An incomplete or damaged checkpoint is named for what it is.

1. `ckpt info` on a checkpoint of 3 ranks with rank_00000.h5 and
   rank_00002.h5 deleted: exit 3, names both missing files and "incomplete"
   (it printed the metadata and exited 0 before); on the complete one, 0.
2. h5py through index.h5 with a rank file missing reads NaN, silently (HDF5's
   virtual-dataset fill): the README's check with `virtual_sources()` (run
   here as the README prints it) finds the missing file, and passes on the
   complete checkpoint.
3. A resume on 2 ranks from a 2-rank checkpoint whose rank_00001.h5 has a
   flipped byte in a /params chunk: rank 0 (which prints) verifies only
   rank_00000.h5 and meets the damage reading through index.h5; the message
   names rank_00001.h5 and the dataset, not only index.h5. Exit 3.
"""
import os
import re
import shutil

import h5py
import numpy as np

from common import check, corpus, parse_args, run, train, tree_digest

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 1,
        "--global-batch", 6, "--steps", 2, "--val-seqs", 4]

# 1. ckpt info with rank files missing
train(a, 3, base + ["--out", W("run3")])
good3 = os.path.join(W("run3"), "ckpt", "step_00000002")
r = run([a.bin, "ckpt", "info", good3], expect_rc=None)
check(r.returncode == 0, "ckpt info on a complete checkpoint exits 0")
inc = W("incomplete")
shutil.copytree(good3, inc)
for n in ("rank_00000.h5", "rank_00002.h5"):
    os.remove(os.path.join(inc, n))
r = run([a.bin, "ckpt", "info", inc], expect_rc=None)
print(r.stdout, r.stderr)
check(r.returncode == 3, f"ckpt info on an incomplete checkpoint exits 3 (got {r.returncode})")
check("incomplete" in r.stderr and "rank_00000.h5" in r.stderr and "rank_00002.h5" in r.stderr,
      "ckpt info names both missing rank files and says incomplete")
check(len(r.stderr.strip().splitlines()) == 1, "one line on stderr")

# ckpt info|verify RUN_DIR checks the step `latest` names, with no fallback
# to an older one: a run whose latest is incomplete fails the check (exit 3).
train(a, 3, base + ["--steps", 4, "--ckpt-every", 2, "--out", W("runlatest")])
os.remove(os.path.join(W("runlatest"), "ckpt", "step_00000004", "rank_00001.h5"))
for action in ("info", "verify"):
    r = run([a.bin, "ckpt", action, W("runlatest")], expect_rc=None)
    check(r.returncode == 3 and "step_00000004" in r.stderr and "rank_00001.h5" in r.stderr,
          f"ckpt {action} RUN_DIR with an incomplete latest exits 3 naming it (got "
          f"{r.returncode}: {r.stderr.strip()[:200]})")

# 2. h5py reads NaN silently; the README's check finds the missing file
with h5py.File(os.path.join(inc, "index.h5"), "r") as f:
    x = f["params/wte.weight"][...]
check(np.isnan(x).any(), "h5py through index.h5 with rank_00000.h5 missing returns NaN, no error")
readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
m = re.search(r"A missing rank file reads as NaN.*?```python\n(.*?)```", readme, re.S)
check(m is not None, "README has the h5py check for missing rank files")
snippet = m.group(1)


def readme_check(d):
    try:
        exec(snippet.replace('"RUN/ckpt/step_00000600"', repr(d)), {})
    except AssertionError as e:
        return str(e)
    return ""


check(readme_check(good3) == "", "the README's check passes on the complete checkpoint")
e = readme_check(inc)
check("rank_00000.h5" in e and "rank_00002.h5" in e,
      f"the README's check names the missing files: {e}")

# 3. a checksum error met through index.h5 names the rank file and dataset
train(a, 2, base + ["--out", W("run2")])
damaged = W("damaged")
shutil.copytree(os.path.join(W("run2"), "ckpt", "step_00000002"), damaged)
victim = os.path.join(damaged, "rank_00001.h5")
with h5py.File(victim, "r") as f:
    name = sorted(f["params"], key=lambda n: -f["params"][n].size)[0]
    info = f["params"][name].id.get_chunk_info(0)
with open(victim, "r+b") as fh:
    fh.seek(info.byte_offset + info.size // 2)
    b = fh.read(1)
    fh.seek(info.byte_offset + info.size // 2)
    fh.write(bytes([b[0] ^ 0xFF]))
before = tree_digest(damaged)
r = train(a, 2, base + ["--steps", 4, "--out", W("resumed"), "--resume", damaged], expect_rc=None)
print(r.stderr)
check(r.returncode == 3, f"resume from a damaged checkpoint exits 3 (got {r.returncode})")
err = [l for l in r.stderr.splitlines() if l.startswith("shardtrain")]
check(len(err) == 1 and "rank_00001.h5" in err[0] and f"/params/{name}" in err[0]
      and "checksum" in err[0], f"the message names rank_00001.h5, /params/{name} and the checksum")
check(tree_digest(damaged) == before, "the damaged checkpoint is left as it was")
