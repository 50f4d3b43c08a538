"""What a new user meets in README.md and docs/: no path that points outside
the repository, every repository path they name exists, docs/tests.md names
every test of the suite, `train --help` names every flag train takes, commands call the
binary where the build puts it (build/shardtrain), and two examples run as
written: the 4-rank mpirun block (with a small --steps) and the h5py line
against a real checkpoint, printing what the README says it prints."""
import glob
import os
import re
import subprocess

from common import check, corpus, parse_args, run, train

a = parse_args()
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
pages = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
text = {os.path.relpath(p, ROOT): open(p).read() for p in pages}
check("docs/design.md" in text, "docs/design.md exists (the project's own design page)")

# 1. Nothing outside the repository; every repository path named exists.
TOP = "(?:docs|bench|scripts|slurm|tests|launcher|rank|io|kernels|collectives|util)"
# rank/'s planned wings: the design page names them as the target, not as files.
PLANNED = {"docs/design.md": {"rank/model/", "rank/memory/", "rank/optim/", "rank/train/"}}
for name, t in text.items():
    out = re.findall(r"\.\./[\w./-]+", t)
    check(not out, f"{name}: no path outside the repository ({out[:3]})")
    missing = []
    for ref in re.findall(r"`(" + TOP + r"/[\w./-]*)`", t):
        path = ref.rstrip(".")
        if "*" in path or "{" in path:
            continue
        if not os.path.exists(os.path.join(ROOT, path)) and path not in PLANNED.get(name, ()):
            missing.append(path)
    check(not missing, f"{name}: every repository path it names exists (missing: {missing[:5]})")
check("docs/design.md" in text["README.md"], "README links the design page in docs/")


def blocks(t):
    """The README's fenced code blocks, as lists of lines."""
    return [b.splitlines() for b in re.findall(r"```\n(.*?)```", t, re.S)]


# 1b. docs/tests.md names every test of this build's ctest suite, as the
# README says it does ("name{a,b}" in backticks stands for name + a, name + b).
listed = subprocess.run(["ctest", "-N"], cwd=os.path.dirname(os.path.abspath(a.bin)),
                        capture_output=True, text=True)
suite = re.findall(r"Test\s+#\d+: (\S+)", listed.stdout)
named = set()
for tok in re.findall(r"`([\w{},]+)`", text["docs/tests.md"]):
    m = re.match(r"(\w*)\{([\w,]+)\}(\w*)$", tok)
    named.update(m.group(1) + x + m.group(3) for x in m.group(2).split(",")) if m else named.add(tok)
check(len(suite) > 50, f"ctest -N in the build directory lists the suite ({len(suite)} tests)")
missing = [t for t in suite if t not in named]
check(not missing, f"docs/tests.md names every ctest test (missing: {missing[:6]})")

# 1c. `train --help` names every flag train takes (launcher/cli.c's k_flags,
# the list "did you mean" suggests from): a flag it omits exists only for
# those who read the source (--enforce-gpu-mem did until 2026-12-07).
cli = open(os.path.join(ROOT, "launcher", "cli.c")).read()
k = re.search(r"k_flags\[\] = \{(.*?)NULL\};", cli, re.S)
flags = re.findall(r'"(--[\w-]+)"', k.group(1)) if k else []
check(len(flags) > 50, f"launcher/cli.c's k_flags lists train's flags ({len(flags)})")
helptext = run([a.bin, "train", "--help"]).stdout
absent = [f for f in flags if f != "--help" and not re.search(re.escape(f) + r"(?![\w-])", helptext)]
check(not absent, f"train --help names every flag train takes (missing: {absent[:6]})")

readme = text["README.md"]
# 2. Commands call build/shardtrain: a fresh clone has no shardtrain on PATH.
bare = [l for b in blocks(readme) for l in b
        if re.match(r"\s*(?:shardtrain |mpirun .*?(?<!/)shardtrain )", l)]
check(not bare, f"README: no code line calls a bare shardtrain ({bare[:2]})")
first = blocks(readme)[0]
check(first[0].startswith("scripts/demo.sh") and first[1].startswith("scripts/test.sh"),
      "README leads with scripts/demo.sh and scripts/test.sh")

# A work directory laid out like a checkout: build/shardtrain, data/kjv.h5.
w = os.path.join(a.work, "checkout")
os.makedirs(os.path.join(w, "data"))
os.symlink(os.path.dirname(os.path.abspath(a.bin)), os.path.join(w, "build"))
os.symlink(corpus(a), os.path.join(w, "data", "kjv.h5"))

# 3. The multi-rank example as written (4 ranks, as root too), 1 step.
mp = [b for b in blocks(readme) if b and b[0].startswith("mpirun -np 4")]
check(len(mp) == 1, "README has the 4-rank mpirun example")
cmd = " ".join(l.rstrip("\\").strip() for l in mp[0])
check("--allow-run-as-root" in cmd and "--oversubscribe" in cmd,
      "the 4-rank example carries --allow-run-as-root and --oversubscribe")
cmd = re.sub(r"--steps \d+", "--steps 1", cmd)
r = subprocess.run(cmd, shell=True, cwd=w, capture_output=True, text=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
check(r.returncode == 0 and "done: step 1" in r.stdout,
      f"the 4-rank example runs as written (--steps 1): exit {r.returncode} {r.stderr[-300:]}")

# 4. The h5py line, run as written against a checkpoint of the demo's shape.
py = [l for b in blocks(readme) for l in b if l.startswith("/usr/bin/python3 -c")]
check(len(py) == 1, "README has the h5py example with its interpreter")
m = re.search(re.escape(py[0]) + r"\n```\n\nprints `([^`]+)`", readme)
check(m is not None, "README says what the h5py example prints")
train(a, 2, ["--data", os.path.join(w, "data", "kjv.h5"), "--out", os.path.join(w, "runs", "demo"),
             "--model", "small", "--seq-len", 128, "--micro-batch", 2, "--global-batch", 4,
             "--steps", 1, "--val-seqs", 4])
r = subprocess.run(py[0], shell=True, cwd=w, capture_output=True, text=True)
check(r.returncode == 0 and r.stdout.strip() == m.group(1),
      f"the h5py example prints '{m.group(1)}' as the README says: got '{r.stdout.strip()}' "
      f"{r.stderr[-200:]}")
run([a.bin, "ckpt", "verify", os.path.join(w, "runs", "demo")])
