"""`shardtrain bench train` on CPU ranks (tiny model, a few steps), started
as one process that launches mpirun itself: 1,2 and 1,2,4 ranks, weak and
strong. The tables and scaling.json's fields exist; efficiency and TFLOP/s
follow from the JSON's own tokens/s and the run's model; the phases add up
to the step; --json lines equal the file; bench/train_scaling.sh (now a
wrapper) and bench/plot_scaling.py still work; a failing run names its log
and exits 1; bad bench flags exit 2 before anything runs. A smoke test: no
timing is asserted."""
import json
import os
import subprocess
import sys

from common import check, corpus, parse_args, run

a = parse_args()
data = corpus(a)
root = os.path.join(os.path.dirname(__file__), "..", "..")
launcher = f"{a.mpirun} --allow-run-as-root --oversubscribe --bind-to none"
TRAIN = ["--data", data, "--model", "tiny", "--seq-len", "32", "--micro-batch", "2",
         "--steps", "5", "--device", "cpu"]


def bench(args, expect_rc=0, env=None):
    return run([a.bin, "bench", "train"] + [str(x) for x in args], env=env, expect_rc=expect_rc)


def metrics(d):
    lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    return lines[0]["memory_plan"], [m for m in lines if "t_step_ms" in m]


def check_result(out, ranks, modes, stdout=None):
    res = json.load(open(os.path.join(out, "scaling.json")))
    check(list(res) == modes, f"{ranks}: scaling.json has the modes {modes}, in order")
    fields = ("ranks", "tokens_per_s", "tflops_per_rank", "mfu", "t_step_ms", "t_data_ms",
              "t_compute_ms", "t_comm_ms", "t_optimizer_ms", "efficiency", "micro_batch",
              "global_batch", "steps_timed")
    for mode in modes:
        rows = res[mode]
        check([r["ranks"] for r in rows] == ranks, f"{mode}: one row per rank count {ranks}")
        check(all(f in r for r in rows for f in fields), f"{mode}: every row has {fields}")
        base = rows[0]
        check(base["efficiency"] == 1.0, f"{mode}: efficiency 1 at the smallest rank count")
        for r in rows:
            n = r["ranks"]
            want = r["tokens_per_s"] / (n / base["ranks"] * base["tokens_per_s"])
            check(abs(r["efficiency"] - want) <= 1e-12 * want,
                  f"{mode} {n}: efficiency = tokens/s / (ranks ratio x base tokens/s)")
            mb, gb = (2, 2 * n) if mode == "weak" else (2 * max(ranks) // n, 2 * max(ranks))
            check((r["micro_batch"], r["global_batch"]) == (mb, gb),
                  f"{mode} {n}: micro-batch {mb} per rank, global batch {gb}")
            d = os.path.join(out, f"{mode}-{n}")
            plan, steps = metrics(d)
            check(len(steps) == 5 and r["steps_timed"] == 4, f"{mode} {n}: 5 timed steps, "
                  "the first left out")
            # what the command computed, again from the run's own files
            P, C, L, T = (plan["model"][k] for k in ("params", "n_embd", "n_layer", "seq_len"))
            med = lambda k: sorted(s[k] for s in steps[1:])[1:3]
            step = sum(med("t_step_ms")) / 2
            check(abs(r["t_step_ms"] - step) < 1e-9, f"{mode} {n}: median step after the first")
            tps = gb * T / (step / 1e3)
            check(abs(r["tokens_per_s"] - tps) <= 1e-9 * tps, f"{mode} {n}: tokens/s = G x T / "
                  "median step")
            tfl = (6 * P + 6 * L * C * T) * tps / n / 1e12
            check(abs(r["tflops_per_rank"] - tfl) <= 1e-9 * tfl, f"{mode} {n}: TFLOP/s per rank"
                  " = (6N + 6LCT) x tokens/s / ranks")
            check(r["mfu"] is None, f"{mode} {n}: no MFU without --peak-tflops")
            # each step's phases are the step (compute is its remainder);
            # the medians of the phases add up to about the median step
            check(all(abs(s["t_data_ms"] + s["t_compute_ms"] + s["t_comm_ms"] +
                          s["t_optimizer_ms"] - s["t_step_ms"]) < 0.01 for s in steps),
                  f"{mode} {n}: every step's data + compute + comm + optimizer = step")
            # each phase's column is that phase's own median over the same
            # steps (exact: a sum of medians need not be near the median sum
            # when one step of four is slow, as on a loaded CI machine)
            for k in ("t_data_ms", "t_compute_ms", "t_comm_ms", "t_optimizer_ms"):
                want = sum(med(k)) / 2
                check(abs(r[k] - want) <= 1e-9 * max(want, 1e-9),
                      f"{mode} {n}: {k} {r[k]:.4f} is the median of the timed steps' {want:.4f}")
            check(all(x >= 0 for x in (r["t_data_ms"], r["t_comm_ms"], r["t_optimizer_ms"])) and
                  r["t_data_ms"] > 0 and r["t_optimizer_ms"] > 0 and r["t_compute_ms"] > 0,
                  f"{mode} {n}: data, compute and optimizer measured")
            if n > 1:
                check(all(s["t_comm_ms"] > 0 for s in steps), f"{mode} {n}: exposed "
                      "communication measured on every step")
            log = open(d + ".log").read()
            check(log.startswith("# shardtrain bench train:") and "--step-timing" in log and
                  f"--out {d}" in log, f"{mode} {n}: the log starts with the run's command")
            if stdout is not None:
                row = [l for l in stdout.splitlines()
                       if l.split()[:1] == [str(n)] and f"{r['tokens_per_s']:.0f}" in l]
                check(len(row) >= 1, f"{mode} {n}: a table row with {r['tokens_per_s']:.0f} "
                      "tokens/s")
    if stdout is not None:
        for mode in modes:
            check(f"{mode} scaling (" in stdout, f"the {mode} table is printed")
        check(stdout.count("tokens/s  TFLOP/s/rank    MFU     eff   step ms    data   compute"
                           "    comm   optim") == len(modes), "each table has its header")
        check("synchronises" in stdout, "the output says --step-timing synchronises")
    return res


# 1. 1 and 2 ranks, weak and strong, tables on stdout
out12 = os.path.join(a.work, "b12")
r = bench(["--ranks", "1,2", "--out", out12, "--launcher", launcher, "--"] + TRAIN)
print(r.stdout[-3000:])
res12 = check_result(out12, [1, 2], ["weak", "strong"], r.stdout)

# 2. 1, 2 and 4 ranks through ST_MPIRUN, --json: one object per mode and rank
# count on stdout, equal to scaling.json's rows; --peak-tflops gives MFU
out124 = os.path.join(a.work, "b124")
r = bench(["--ranks", "4,1,2", "--out", out124, "--json", "--"] + TRAIN,
          env={"ST_MPIRUN": launcher})
print(r.stderr[-2000:])
res124 = check_result(out124, [1, 2, 4], ["weak", "strong"])
lines = [json.loads(l) for l in r.stdout.splitlines()]
check([(x["mode"], x["ranks"]) for x in lines] ==
      [(m, n) for m in ("weak", "strong") for n in (1, 2, 4)],
      "--json: a line per mode and rank count, ranks sorted")
check(all({k: v for k, v in x.items() if k != "mode"} == res124[x["mode"]][i % 3]
          for i, x in enumerate(lines)), "--json lines equal scaling.json's rows")
check("(ST_MPIRUN)" in r.stderr, "the launcher came from ST_MPIRUN, as the header says")
r = bench(["--ranks", "1,2", "--modes", "weak", "--peak-tflops", "0.5", "--out",
           os.path.join(a.work, "peak"), "--launcher", launcher, "--"] + TRAIN)
res = json.load(open(os.path.join(a.work, "peak", "scaling.json")))
check(list(res) == ["weak"] and all(abs(x["mfu"] - x["tflops_per_rank"] / 0.5) < 1e-12
                                    for x in res["weak"]),
      "--modes weak; MFU = TFLOP/s per rank / --peak-tflops")
row1 = [l.split() for l in r.stdout.splitlines() if l.split()[:1] == ["1"]]
check(len(row1) == 1 and row1[0][3].endswith("%"), "the MFU column is filled")

# 3. bench/train_scaling.sh is a wrapper around the command; the plot
env = dict(os.environ, BIN=a.bin, OMP_NUM_THREADS="1", MPIRUN=launcher, MODES="strong")
sh = os.path.join(a.work, "sh")
r = subprocess.run(["bash", os.path.join(root, "bench", "train_scaling.sh"), sh, "1,2"] + TRAIN,
                   capture_output=True, text=True, env=env)
print(r.stdout[-1500:], r.stderr[-1500:])
check(r.returncode == 0 and list(json.load(open(os.path.join(sh, "scaling.json")))) ==
      ["strong"], "bench/train_scaling.sh (MODES=strong) runs bench train")
for src, png in ((out12, "scaling.png"), (sh, "strong.png")):
    png = os.path.join(a.work, png)
    subprocess.run([sys.executable, os.path.join(root, "bench", "plot_scaling.py"),
                    os.path.join(src, "scaling.json"), png], check=True)
    check(open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", f"plot_scaling.py draws {png}")

# 4. a failing run: exit 1, the message names the log, its first error and
# its last lines; nothing after it runs
bad = os.path.join(a.work, "bad")
missing = os.path.join(a.work, "no-such.h5")
r = bench(["--ranks", "1,2", "--out", bad, "--launcher", launcher, "--"] + TRAIN[2:] +
          ["--data", missing], expect_rc=1)
log = os.path.join(bad, "weak-1.log")
print(r.stderr)
check(f"the weak run on 1 rank failed (exit code 4); its output is in {log}" in r.stderr,
      "a failed run: which run, its exit code and its log")
check("first error:" in r.stderr and missing in r.stderr and "which ends:" in r.stderr,
      "the message quotes the run's error and the log's last lines")
check(os.path.exists(log) and not os.path.exists(os.path.join(bad, "weak-2.log")),
      "the bench stops at the failed run")
r = bench(["--ranks", "1", "--out", bad, "--launcher", "no-such-launcher --flag", "--"] + TRAIN,
          expect_rc=1)
check("cannot start the launcher 'no-such-launcher'" in r.stderr,
      "a launcher that does not exist is named")

# 5. bad bench flags: exit 2, one message, nothing run or written
nothing = os.path.join(a.work, "nothing")
for args, want in [
        (["--rank", "1,2", "--"] + TRAIN, "did you mean --ranks?"),
        (["--ranks", "1,2", "--data", data, "--"] + TRAIN, "--data is a train flag"),
        (["--ranks", "1,x", "--"] + TRAIN, "--ranks 1,x"),
        (["--ranks", "1,2", "--modes", "weak,bogus", "--"] + TRAIN, "--modes weak,bogus"),
        (["--ranks", "1,2", "--peak-tflops", "-1", "--"] + TRAIN, "--peak-tflops -1"),
        (["--ranks", "1,2", "--"] + TRAIN + ["--micro-bach", "2"], "did you mean --micro-batch?"),
        (["--ranks", "1,2", "--"] + TRAIN + ["--out", "x"], "train flag --out is set by bench"),
        (["--ranks", "1,2", "--"] + TRAIN + ["--global-batch", "8"], "--global-batch is set"),
        (["--ranks", "3,4", "--"] + TRAIN, "does not divide over 3 ranks"),
        (["--ranks", "1,2048", "--modes", "weak", "--"] + TRAIN + ["--micro-batch", "1048576"],
         "more than train's largest --global-batch"),
        (["--"] + TRAIN, "needs --ranks"),
        (["--ranks", "1,2"], "needs train's flags after --"),
        (["--ranks", "1,2", "--launcher"], "--launcher needs a value")]:
    r = bench(["--out", nothing] + args, expect_rc=2)
    check(want in r.stderr and r.stderr.count("error:") == 1, f"exit 2: {want}")
check(not os.path.exists(nothing), "bad flags write nothing")
r = run([a.mpirun, "--allow-run-as-root", "-np", "1", a.bin, "bench", "train", "--ranks", "1",
         "--"] + TRAIN, expect_rc=None)
check(r.returncode != 0 and "not under a launcher" in r.stderr,
      "under mpirun, bench train refuses to start runs of its own")
r = run([a.bin, "bench", "train", "--help"])
check("--ranks LIST" in r.stdout and "1-3%" in r.stdout, "bench train --help")
