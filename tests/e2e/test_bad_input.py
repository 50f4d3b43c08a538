"""Each kind of bad input exits non-zero with one clear message naming the
file or flag and the fix, and overwrites nothing: the data file and the
run's previous checkpoint (and `latest`) stay byte-identical."""
import os
import shutil
import subprocess

from common import check, corpus, parse_args, run, train, tree_digest

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
        "--global-batch", 4, "--val-seqs", 4]

# A good run whose checkpoint every case below must leave alone.
good = W("good")
train(a, 2, base + ["--steps", 4, "--out", good])
data_digest = tree_digest(data)
ckpt_digest = tree_digest(os.path.join(good, "ckpt"))


def expect_fail(name, args, rc, words, np=2, out=good):
    r = train(a, np, args + ["--out", out], expect_rc=None)
    err = r.stderr
    check(r.returncode == rc, f"{name}: exit code {r.returncode} == {rc}")
    for w in words:
        check(w in err, f"{name}: message mentions '{w}'")
    check(err.count("shardtrain: error") == 1, f"{name}: exactly one error line, from one rank")
    check(tree_digest(data) == data_digest, f"{name}: data file unchanged")
    check(tree_digest(os.path.join(good, "ckpt")) == ckpt_digest,
          f"{name}: previous checkpoint and latest unchanged")


steps = ["--steps", 6]
# 1. missing data file
expect_fail("missing data", ["--data", W("nope.h5")] + base[2:] + steps, 4,
            ["nope.h5", "shardtrain prep"])
# 2. malformed data file: not HDF5 at all
bad = W("garbage.h5")
open(bad, "w").write("this is not an HDF5 file\n" * 100)
expect_fail("malformed data", ["--data", bad] + base[2:] + steps, 4, ["garbage.h5"])
# 3. llm.c shard with a wrong magic number
badbin = W("bad.bin")
open(badbin, "wb").write(b"\0" * 2048)
expect_fail("bad .bin header", ["--data", badbin] + base[2:] + steps, 4, ["bad.bin", "magic"])
# 4. data smaller than one global batch
small_txt, small = W("small.txt"), W("small.h5")
open(small_txt, "w").write("In the beginning God created the heaven and the earth. " * 20)
run([a.bin, "prep", "--input", small_txt, "--out", small])
expect_fail("data smaller than a global batch", ["--data", small, "--model", "tiny",
            "--seq-len", 32, "--micro-batch", 2, "--global-batch", 64] + steps, 4,
            ["small.h5", "fewer than one global batch", "--global-batch"])
# 5. global batch not divisible by micro-batch x ranks
expect_fail("indivisible global batch", base[:-4] + ["--global-batch", 6, "--val-seqs", 4] + steps,
            2, ["--global-batch 6", "--micro-batch 2", "2 ranks", "use --global-batch 4 or 8"])
# 6. checkpoint of a different model shape
expect_fail("different model shape", base + ["--dim", 32, "--heads", 4] + steps, 3,
            ["different shape", "--dim"])
# 7. corrupted checkpoint (flip bytes inside a rank file's data)
latest = open(os.path.join(good, "ckpt", "latest")).read().strip()
corrupt = W("corrupt")
shutil.copytree(good, corrupt)
rf = os.path.join(corrupt, "ckpt", latest, "rank_00000.h5")
blob = bytearray(open(rf, "rb").read())
for i in range(len(blob) // 2, len(blob) // 2 + 64):
    blob[i] ^= 0xFF
open(rf, "wb").write(blob)
before = tree_digest(os.path.join(corrupt, "ckpt"))
r = train(a, 2, base + steps + ["--out", corrupt], expect_rc=None)
check(r.returncode == 3, f"corrupted checkpoint: exit code {r.returncode} == 3")
check("rank_00000.h5" in r.stderr and ("corrupt" in r.stderr or "checksum" in r.stderr),
      "corrupted checkpoint: message names the rank file and the checksum")
check(tree_digest(os.path.join(corrupt, "ckpt")) == before, "corrupted checkpoint: left as it was")
# 8. a rank file missing
missing = W("missing")
shutil.copytree(good, missing)
os.remove(os.path.join(missing, "ckpt", latest, "rank_00001.h5"))
before = tree_digest(os.path.join(missing, "ckpt"))
r = train(a, 2, base + steps + ["--out", missing], expect_rc=None)
check(r.returncode == 3 and "rank_00001.h5" in r.stderr and "--resume" in r.stderr,
      "missing rank file: exit 3, names the file and --resume")
check(tree_digest(os.path.join(missing, "ckpt")) == before, "missing rank file: left as it was")
# 9. unwritable output directory (a path below a regular file: root ignores modes)
expect_fail("unwritable --out", base + steps, 1, ["--out"], out=os.path.join(bad, "run"))
# 10. unknown flag, and a bad flag value
expect_fail("unknown flag", base + steps + ["--learning-rate", 1], 2, ["--learning-rate"])
expect_fail("misspelt flag", base + steps + ["--micro-batchs", 4], 2,
            ["--micro-batchs", "did you mean --micro-batch?"])
expect_fail("bad flag value", base + ["--steps", "ten"], 2, ["--steps", "ten"])
r = run([a.bin, "train"] + [str(x) for x in base] + ["--out", W("last"), "--auto-fitt"], expect_rc=2)
check("unknown flag '--auto-fitt' (did you mean --auto-fit?)" in r.stderr,
      "a misspelt flag last on the line is unknown, not 'needs a value'")
expect_fail("--enforce-gpu-mem without --gpu-mem", base + steps + ["--enforce-gpu-mem"], 2,
            ["--enforce-gpu-mem", "give --gpu-mem SIZE too"])
expect_fail("--enforce-gpu-mem on the CPU", base + steps + ["--enforce-gpu-mem", "--gpu-mem", "8GiB"],
            2, ["--enforce-gpu-mem", "needs the CUDA backend"])
# 11. --resume none over existing checkpoints refuses instead of overwriting
expect_fail("--resume none over a run", base + steps + ["--resume", "none"], 2,
            ["--resume auto", "new --out"])
# 12. --device cuda without a GPU (or without a CUDA build)
if subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode != 0:
    expect_fail("--device cuda", base + steps + ["--device", "cuda"], 2, ["--device cuda"])
# 13. the launcher's variables disagree with MPI (a task that thinks it is
#     rank 1 of 2 but was started alone): stop before doing anything
r = run([a.bin, "train"] + [str(x) for x in base + steps] + ["--out", W("env")], expect_rc=None,
        env={"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"})
check(r.returncode == 2 and "SLURM_NTASKS=2" in r.stderr and "srun --mpi=pmix" in r.stderr,
      "srun without PMIx (2 tasks, MPI world of 1): exit 2 naming SLURM_NTASKS and the fix")
r = run([a.bin, "train"] + [str(x) for x in base + steps] + ["--out", W("env")], expect_rc=None,
        env={"SLURM_PROCID": "1", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
check(r.returncode == 2 and "SLURM_PROCID=1" in r.stderr and "rank 0" in r.stderr,
      "Slurm rank that disagrees with MPI: exit 2 naming SLURM_PROCID")
check(not os.path.exists(W("env")), "launcher mismatch: no run directory was created")
# 14. NCCL_BUFFSIZE is read strictly: train (every rank, before any collective
#     or NCCL's init) and plan refuse a value NCCL and the memory plan would
#     read differently, with exit 2 and one line naming it; nothing is made.
for v in ["abc", "4MiB", "1.5", "", "-1", "0", "9223372036854775808"]:
    r = train(a, 2, base + steps + ["--out", W("bs")], expect_rc=None, env={"NCCL_BUFFSIZE": v})
    check(r.returncode == 2 and "NCCL_BUFFSIZE" in r.stderr
          and r.stderr.count("shardtrain: error") == 1,
          f"train with NCCL_BUFFSIZE='{v}': exit 2, one error line naming the variable")
    r = run([a.bin, "plan", "--model", "tiny", "--micro-batch", "2", "--global-batch", "4"],
            expect_rc=None, env={"NCCL_BUFFSIZE": v})
    check(r.returncode == 2 and "NCCL_BUFFSIZE" in r.stderr,
          f"plan with NCCL_BUFFSIZE='{v}': exit 2 naming the variable")
check(not os.path.exists(W("bs")), "bad NCCL_BUFFSIZE: no run directory was created")
# A good value trains on the CPU and is said to be ignored there, once (rank 0).
r = train(a, 2, base + ["--steps", 2, "--out", W("bs_ok")], env={"NCCL_BUFFSIZE": "8388608"})
check(r.stdout.count("NCCL_BUFFSIZE is set, but the CPU backend") == 1,
      "NCCL_BUFFSIZE on the CPU: one notice that it is ignored")
# 15. bench train with an ST_MPIRUN of blanks: a usage error naming it, not a
#     launch of an unset program name (clang-analyzer's finding in bench_train.c)
r = run([a.bin, "bench", "train", "--ranks", "1", "--out", W("bt"), "--", "--data", data,
         "--model", "tiny", "--steps", "2"], expect_rc=None, env={"ST_MPIRUN": "   "})
check(r.returncode == 2 and "ST_MPIRUN" in r.stderr and r.stderr.count("shardtrain: error") == 1,
      "bench train with ST_MPIRUN of blanks: exit 2 naming ST_MPIRUN")
# 16. numbers and sizes a file or a typo can hold that strtod reads but are
#     none: NaN, infinity, trailing text (found by tests/fuzz; each exit 2
#     with one line quoting the value, and nothing written)
for flag, v in [("--gpu-mem", "NAN"), ("--gpu-mem", "inf"), ("--lr", "nan"),
                ("--lr", "3e-4x")]:
    r = train(a, 1, base + steps + ["--out", W("num"), flag, v], expect_rc=None)
    check(r.returncode == 2 and flag in r.stderr and r.stderr.count("shardtrain: error") == 1,
          f"train {flag} {v}: exit 2, one error line naming the flag")
check(not os.path.exists(W("num")), "bad numbers: no run directory was created")
for v in ["abc", "0.1x", "nan"]:
    out = W("vf.h5")
    r = run([a.bin, "prep", "--input", small_txt, "--out", out, "--val-fraction", v],
            expect_rc=None)
    check(r.returncode == 2 and f"'{v}'" in r.stderr and not os.path.exists(out),
          f"prep --val-fraction {v}: exit 2 quoting the value, no file written")
r = run([a.bin, "bench", "collectives", "--nccl-timeout", "abc"], expect_rc=None)
check(r.returncode == 2 and "--nccl-timeout" in r.stderr and "'abc'" in r.stderr,
      "bench collectives --nccl-timeout abc: exit 2 quoting the value")
