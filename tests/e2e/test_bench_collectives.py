"""`shardtrain bench collectives` on CPU ranks (MPI): for 1, 2 and 4 ranks
every op is checked and reported at every doubling size from 8 B; the
reported busbw follows nccl-tests' definitions from the reported time and
size; a corrupted result is caught (exit 5, the op named); bad flags exit 2.
No timing is asserted."""
import json

from common import check, parse_args, run

a = parse_args()
FACTOR = {"all-reduce": lambda n: 2 * (n - 1) / n, "reduce-scatter": lambda n: (n - 1) / n,
          "all-gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def bench(np, extra, env=None, expect_rc=0):
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(np), "-x", "ST_FAULT_BENCH_CORRUPT", a.bin, "bench", "collectives", "--device",
           "cpu", "--max-bytes", "64KiB", "--iters", "3", "--warmup", "1"] + extra
    return run(cmd, env=env, expect_rc=expect_rc)


for np in (1, 2, 4):
    r = bench(np, ["--json"])
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    for op, f in FACTOR.items():
        mine = [x for x in rows if x["op"] == op]
        sizes = [x["bytes"] for x in mine]
        step = 4 * np if op in ("reduce-scatter", "all-gather") else (1 if op == "broadcast" else 4)
        want = [s for s in (8 << k for k in range(14)) if s <= 65536 and s >= step]
        check(sizes == want, f"{np} ranks, {op}: sizes {want[0]}..{want[-1]} B doubling")
        check(all(x["correct"] and x["ranks"] == np for x in mine), f"{np} ranks, {op}: all checked ok")
        check(all(abs(x["algbw_GBs"] - x["bytes"] / (x["time_us"] * 1e3)) <= 1e-2 * x["algbw_GBs"] + 1e-5
                  and abs(x["busbw_GBs"] - x["algbw_GBs"] * f(np)) <= 1e-3 * x["busbw_GBs"] + 1e-5
                  for x in mine), f"{np} ranks, {op}: algbw = S/t, busbw = algbw x {f(np):.3f}")
        per = {"all-reduce": lambda s: s // 4, "reduce-scatter": lambda s: s // 4 // np,
               "all-gather": lambda s: s // 4 // np, "broadcast": lambda s: s}[op]
        check(all(x["count"] == per(x["bytes"]) for x in mine), f"{np} ranks, {op}: counts")
    check(all(x["timing"] == "pipelined" for x in rows), f"{np} ranks: pipelined timing by default")

r = bench(2, ["--json", "--timing", "blocking", "--ops", "reduce-scatter"])
rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
check(rows and all(x["timing"] == "blocking" and x["correct"] for x in rows),
      "--timing blocking is recorded per line and still checks every size")
r = bench(1, ["--timing", "async"], expect_rc=2)
check("--timing async: use pipelined or blocking" in r.stderr, "a bad --timing exits 2 with the choices")

r = bench(2, ["--ops", "all-reduce"], env={"ST_FAULT_BENCH_CORRUPT": "1"}, expect_rc=5)
check("all-reduce of 8 bytes on 2 ranks returned wrong values" in r.stderr,
      "a corrupted all-reduce result is caught and named (exit 5)")
r = bench(2, ["--ops", "all-sum"], expect_rc=2)
check("unknown collective 'all-sum'" in r.stderr, "an unknown --ops name exits 2 with the list")
r = bench(1, ["--max-bytes", "lots"], expect_rc=2)
check("--max-bytes lots" in r.stderr, "a bad size exits 2 naming the flag")

# The plot of busbw against size, from the JSON (matplotlib, Debian's).
import os
import subprocess
import sys

jl = os.path.join(a.work, "busbw.jsonl")
open(jl, "w").write(bench(2, ["--json"]).stdout)
png = os.path.join(a.work, "busbw.png")
subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..", "bench",
                                             "plot_busbw.py"), jl, png], check=True)
check(open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "bench/plot_busbw.py draws a PNG from the JSON")

# bench model: the alpha-beta fit of these points and a projection.
r = run([a.bin, "bench", "model", "--results", jl, "--nodes", "1,2,4", "--json"])
proj = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
check([p["nodes"] for p in proj] == [1, 2, 4] and all(0 < p["efficiency"] <= 1 for p in proj),
      "bench model projects 1, 2 and 4 nodes from the measured points (efficiency in (0, 1])")
check(all(p["step_ms"] >= p["compute_ms"] and p["exposed_ms"] <= p["comm_ms"] + 1e-9 for p in proj)
      and proj[0]["efficiency"] >= proj[-1]["efficiency"],
      "step >= compute, exposed <= comm, efficiency does not rise with nodes")
r = run([a.bin, "bench", "model", "--results", jl], expect_rc=0)
check("assumptions:" in r.stdout and "alpha-beta fit of reduce-scatter" in r.stdout,
      "bench model prints its fit and its assumptions")
r = run([a.bin, "bench", "model"], expect_rc=2)
check("needs --results" in r.stderr, "bench model without points exits 2 saying what it needs")
