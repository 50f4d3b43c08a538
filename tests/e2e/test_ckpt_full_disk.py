"""A disk that fills during a checkpoint save, made for real: --out on a
small tmpfs, pre-filled so that the next save runs out of room (a) while the
rank files are written and (b) after they fit, while index.h5 is written.

Each case: exit 1 (not 139, the segfault in HDF5's close at exit), one
`shardtrain:` line on stderr naming the file and the fix and no HDF5 dump,
`latest` still names the previous checkpoint, which still verifies, and no
.tmp_step directory is left. And `prep` onto a full disk: exit 1, one line.
Needs root (mount); exits 77 (skipped) where mounting is not permitted.
"""
import os
import subprocess
import sys

from common import check, corpus, parse_args, run

a = parse_args()
mnt = os.path.join(a.work, "mnt")
os.makedirs(mnt)
r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", mnt],
                   capture_output=True, text=True)
if r.returncode != 0:
    print(f"SKIP: cannot mount a tmpfs at {mnt} ({r.stderr.strip()}); needs root")
    sys.exit(77)


def umount():
    subprocess.run(["umount", "-l", mnt])


def mpirun(np, args, env=None):
    args = [str(x) for x in args] + ["--device", "cpu"]
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--quiet",
           "-np", str(np), a.bin, "train"] + args
    return run(cmd, env=env, expect_rc=None)


def used(path):
    return os.stat(path).st_blocks * 512


def free_bytes():
    s = os.statvfs(mnt)
    return s.f_bavail * s.f_frsize


def fill_to(free, name):
    """A file that leaves `free` bytes of the tmpfs."""
    n = free_bytes() - free
    with open(os.path.join(mnt, name), "wb") as f:
        if n > 0:
            os.posix_fallocate(f.fileno(), 0, n)
    print(f"filled {max(n, 0)} bytes: {free_bytes()} free")


def shard_lines(stderr):
    """Our lines; mpirun --quiet still adds its own abort notice on some versions."""
    return [l for l in stderr.splitlines() if l.startswith("shardtrain")]


try:
    data = corpus(a)
    base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 1,
            "--global-batch", 2, "--steps", 6, "--ckpt-every", 2, "--val-seqs", 4,
            "--val-every", 0]
    for case in ("rank files", "index.h5"):
        out = os.path.join(mnt, "run_" + case.split()[0].replace(".", "_"))
        # Step 2 is saved with room to spare; its files measure what step 4 needs.
        r = mpirun(2, base + ["--out", out, "--stop-after", 2])
        check(r.returncode == 0, f"{case}: first run saved step 2 (rc {r.returncode}: {r.stderr[-300:]})")
        step2 = os.path.join(out, "ckpt", "step_00000002")
        ranks = sum(used(os.path.join(step2, f"rank_{i:05d}.h5")) for i in range(2))
        index = used(os.path.join(step2, "index.h5"))
        print(f"{case}: rank files {ranks} bytes, index.h5 {index} bytes")
        if case == "rank files":
            fill_to(ranks // 2, "fill_a")
        else:  # room for the rank files, and half of the index
            # (each rank file reserves a page past its end; metrics.jsonl grows)
            fill_to(ranks + 2 * 4096 + 4096 + 16384, "fill_b")
        r = mpirun(2, base + ["--out", out])
        print("stderr:", r.stderr)
        check(r.returncode == 1, f"{case}: the failed save exits 1 (got {r.returncode}; 139 is "
              "the segfault in HDF5's close)")
        lines = shard_lines(r.stderr)
        check(len(lines) == 1, f"{case}: one shardtrain line on stderr (got {len(lines)})")
        msg = lines[0] if lines else ""
        check("HDF5" not in r.stderr and "time =" not in r.stderr and
              "Segmentation" not in r.stderr, f"{case}: no HDF5 error dump, no segfault")
        want = "rank_0000" if case == "rank files" else "index.h5"
        check("no space left on device" in msg and want in msg and "choose another --out" in msg,
              f"{case}: the message names the full disk, the file ({want}) and the fix")
        check("latest still names step_00000002" in msg, f"{case}: the message says latest stays")
        check(open(os.path.join(out, "ckpt", "latest")).read().strip() == "step_00000002",
              f"{case}: latest still names step_00000002")
        left = [n for n in os.listdir(os.path.join(out, "ckpt")) if n.startswith(".")]
        check(not left, f"{case}: no temporary directory left in ckpt/ ({left})")
        check(not os.path.exists(os.path.join(out, "ckpt", "step_00000004")),
              f"{case}: no step_00000004")
        v = run([a.bin, "ckpt", "verify", out], expect_rc=None)
        check(v.returncode == 0 and "verify: OK" in v.stdout,
              f"{case}: the previous checkpoint still verifies")
        for n in os.listdir(mnt):
            if n.startswith("fill"):
                os.unlink(os.path.join(mnt, n))

    # prep onto a full disk: the token file's writes fail inside HDF5.
    fill_to(64 << 10, "fill_c")
    txt = os.path.join(a.work, "corpus.txt")
    p = run([a.bin, "prep", "--input", txt, "--out", os.path.join(mnt, "tokens.h5")],
            expect_rc=None)
    print("stderr:", p.stderr)
    check(p.returncode == 1, f"prep onto a full disk exits 1 (got {p.returncode})")
    check(len(p.stderr.strip().splitlines()) == 1 and "no space left on device" in p.stderr,
          "prep: one line naming the full disk")
    check(not os.path.exists(os.path.join(mnt, "tokens.h5")) and
          not os.path.exists(os.path.join(mnt, "tokens.h5.tmp")), "prep: nothing left behind")
finally:
    umount()
