"""train --offload optimizer (rank/optim/offload.h) on the CPU backend:

(a) bit-exact with the on-device optimizer: the final fp32 weights
    (--dump-params) and every logged loss are identical at ZeRO 0, 1 and 2
    on 1, 2 and 4 ranks, with gradient accumulation (global batch 8 of
    micro-batch 2: 4, 2 and 1 micro-steps), the host step cut into chunks
    of 1000 elements (ST_OFFLOAD_CHUNK) so the copy pipeline runs many
    chunks and cuts tensors and partitions anywhere;
(b) a step with non-finite gradients (ST_FAULT_OVERFLOW) is skipped with
    offload too: nothing updated, the same weights as without offload;
(c) resume with offload on from a checkpoint written with it off, and off
    from on, is bit-exact with the uninterrupted run;
(d) the host check: host memory below the plan's host section
    (ST_FAULT_HOST_MEM_AVAILABLE) exits 6 with one line naming the need,
    what is available and the fix, before anything is written;
(e) plan --offload optimizer: device rows for master/Adam m/v are 0, the
    host section holds them (256-byte rounded, as allocated);
(f) out of memory with offload still exits 7 with the report (ST_FAULT_OOM
    in a step, ST_FAULT_ARENA_SHORT at setup)."""
import json
import os

import numpy as np

from common import check, corpus, losses, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
CHUNK = {"ST_OFFLOAD_CHUNK": "1000"}
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
        "--global-batch", 8, "--lr", 1e-3, "--warmup", 2, "--val-seqs", 8, "--resume", "none"]


def mpi_env(np_, env, args, rc=0):
    """train with env passed to every rank (-x)."""
    xs = sum((["-x", k] for k in env), [])
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(np_)] + xs + [a.bin, "train", "--device", "cpu"] + [str(x) for x in args]
    return run(cmd, env=env, expect_rc=rc)


def same(x, y, what):
    p, q = open(x, "rb").read(), open(y, "rb").read()
    check(len(p) > 0 and p == q, what)


# (a) on-device vs offloaded, ZeRO 0/1/2 x 1/2/4 ranks
for zero in (0, 1, 2):
    for np_ in (1, 2, 4):
        tag = f"z{zero}_np{np_}"
        for off in ("none", "optimizer"):
            out = W(f"{tag}_{off}")
            r = mpi_env(np_, CHUNK, base + ["--steps", 4, "--zero", zero, "--offload", off,
                                            "--out", out, "--dump-params", out + ".f32"])
            if off == "optimizer":
                check("offload    optimizer" in r.stdout and "chunks of 1000 elements" in r.stdout,
                      f"{tag}: the configuration block says the optimizer is offloaded")
        same(W(f"{tag}_none.f32"), W(f"{tag}_optimizer.f32"),
             f"{tag}: final weights bit-identical with --offload optimizer")
        check(losses(W(f"{tag}_none")) == losses(W(f"{tag}_optimizer")),
              f"{tag}: every loss identical")

# (b) skipped steps
ov = dict(CHUNK, ST_FAULT_OVERFLOW="3")
for off in ("none", "optimizer"):
    out = W(f"skip_{off}")
    r = mpi_env(2, ov, base + ["--steps", 5, "--zero", 1, "--offload", off, "--out", out,
                               "--dump-params", out + ".f32"])
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    check([d["step"] for d in lines if d.get("skipped")] == [3], f"{off}: step 3 skipped")
same(W("skip_none.f32"), W("skip_optimizer.f32"),
     "a skipped step leaves the offloaded state as the on-device one (same final weights)")
p = np.fromfile(W("skip_optimizer.f32"), dtype=np.float32)
check(bool(np.isfinite(p).all()), "no non-finite gradient reached the host update")

# (c) resume on <-> off, 2 ranks, ZeRO 2
rb = base[:-2] + ["--zero", 2, "--steps", 6, "--ckpt-every", 3]
full = W("res_full")
mpi_env(2, CHUNK, rb + ["--resume", "none", "--out", full, "--dump-params", full + ".f32"])
for first, second in (("optimizer", "none"), ("none", "optimizer")):
    out = W(f"res_{first}_{second}")
    # the offloaded leg saves synchronously: its checkpoint is written from
    # the host state in place (rank/train/ckpt_save.c), not from a copy
    sync = ["--ckpt-async", "off"] if first == "optimizer" else []
    mpi_env(2, CHUNK, rb + ["--resume", "none", "--offload", first, "--stop-after", 3,
                            "--out", out] + sync)
    mpi_env(2, CHUNK, rb + ["--resume", "auto", "--offload", second, "--out", out,
                            "--dump-params", out + ".f32"])
    same(full + ".f32", out + ".f32",
         f"resume of a --offload {first} checkpoint with --offload {second}: bit-exact")
    check(losses(full) == losses(out), f"{first} -> {second}: every loss identical")

# (c') the same at ZeRO 0, where rank 1's checkpoint partition starts inside
# the whole optimizer range every rank holds (an offset into the host state)
r0 = base[:-2] + ["--zero", 0, "--steps", 6, "--ckpt-every", 3]
full0, out0 = W("res0_full"), W("res0_sync")
mpi_env(2, CHUNK, r0 + ["--resume", "none", "--out", full0, "--dump-params", full0 + ".f32"])
mpi_env(2, CHUNK, r0 + ["--resume", "none", "--offload", "optimizer", "--ckpt-async", "off",
                        "--stop-after", 3, "--out", out0])
mpi_env(2, CHUNK, r0 + ["--resume", "auto", "--out", out0, "--dump-params", out0 + ".f32"])
same(full0 + ".f32", out0 + ".f32",
     "ZeRO 0, 2 ranks: a synchronous offloaded save resumes bit-exact without offload")

# (d) host memory check
out = W("nohost")
r = mpi_env(2, {"ST_FAULT_HOST_MEM_AVAILABLE": "2000000"},
            base + ["--steps", 2, "--offload", "optimizer", "--out", out], rc=6)
err = [l for l in r.stderr.splitlines() if "shardtrain: error" in l]
check(len(err) == 1 and "--offload optimizer needs" in err[0] and "is available" in err[0]
      and "ST_FAULT_HOST_MEM_AVAILABLE 1.91 MiB / 2 rank(s) on this node" in err[0]
      and "--offload none" in err[0], f"exit 6, one line naming need, availability, fix: {err}")
check(not os.path.exists(out), "nothing written")
mpi_env(2, {"ST_FAULT_HOST_MEM_AVAILABLE": "4000000000"},
        base + ["--steps", 1, "--offload", "optimizer", "--out", W("host_ok")])

# (d2) on the CPU the offloaded state is in the rank's own memory, so --gpu-mem
# counts it: a cap between the plan without offload and the plan plus the host
# section refuses offload (exit 6, nothing written) and takes the run without it
with open(os.path.join(W("host_ok"), "metrics.jsonl")) as f:
    mp = json.loads(f.readline())["memory_plan"]
shape = [a.bin, "plan", "--model", "tiny", "--device", "cpu", "--ranks", "2", "--seq-len", "32",
         "--micro-batch", "2", "--global-batch", "8", "--zero", str(mp["config"]["zero"]),
         "--vocab-size", str(mp["model"]["vocab_size"]), "--json"]
with_off = json.loads(run(shape + ["--offload", "optimizer"]).stdout)
check(with_off["bytes"]["total"] == mp["bytes"]["total"], "plan and train agree on the shape")
on_cpu = with_off["bytes"]["total"] + with_off["host"]["total"]
no_off = json.loads(run(shape).stdout)["bytes"]["total"]
check(no_off < on_cpu, f"on the CPU offload takes more of the rank's memory ({no_off} < {on_cpu})")
cap = f"{((no_off + on_cpu) // 2 * 100 // 95 + 1023) // 1024}KiB"
t = run(shape[:-1] + ["--offload", "optimizer", "--gpu-mem", cap], expect_rc=6).stdout
check("counted against --gpu-mem" in t and "DOES NOT FIT" in t,
      f"plan --offload optimizer --gpu-mem {cap}: the host section counted, does not fit")
out = W("cap_offload")
r = mpi_env(2, {}, base + ["--steps", 1, "--offload", "optimizer", "--gpu-mem", cap, "--out", out],
            rc=6)
err = [l for l in r.stderr.splitlines() if "shardtrain: error" in l]
check(len(err) == 1 and "the memory plan needs" in err[0] and "--gpu-mem" in err[0],
      f"--offload optimizer on the CPU under --gpu-mem {cap}: exit 6, one line: {err}")
check(not os.path.exists(out), "nothing written")
mpi_env(2, {}, base + ["--steps", 1, "--gpu-mem", cap, "--out", W("cap_device")])

# (e) the plan
R = lambda b: (b + 255) // 256 * 256
for zero in (0, 1):
    r = run([a.bin, "plan", "--model", "tiny", "--device", "cpu", "--ranks", "2", "--zero",
             str(zero), "--offload", "optimizer", "--json"])
    j = json.loads(r.stdout)
    b, h = j["bytes"], j["host"]
    check(b["master"] == b["adam_m"] == b["adam_v"] == 0, f"zero {zero}: device rows are 0")
    n = j["model"]["padded_params"] if zero == 0 else j["model"]["shard"]
    stage = min(n, h["chunk_elements"])
    check(h["master"] == h["adam_m"] == h["adam_v"] == R(4 * n), f"zero {zero}: host m, v, master")
    check(h["grad_staging"] == 2 * R(4 * stage) and h["work_staging"] == 2 * R(4 * stage),
          f"zero {zero}: two staging chunks each way")
    check(h["total"] == 3 * R(4 * n) + 4 * R(4 * stage), f"zero {zero}: host total")
    r0 = json.loads(run([a.bin, "plan", "--model", "tiny", "--device", "cpu", "--ranks", "2",
                         "--zero", str(zero), "--json"]).stdout)
    check(r0["bytes"]["total"] - b["total"] == 2 * R(4 * n) and "host" not in r0,
          f"zero {zero}: the device total drops by Adam m and v, no host section without offload")
t = run([a.bin, "plan", "--model", "tiny", "--device", "cpu", "--offload", "optimizer"]).stdout
check("offloaded to host" in t and "host memory per rank (pinned)" in t and "host total" in t,
      "the table says offloaded to host and has a host section")

# (f) out of memory still reported
r = mpi_env(2, dict(CHUNK, ST_FAULT_OOM="1:2"),
            base + ["--steps", 3, "--offload", "optimizer", "--out", W("oom")], rc=7)
check(r.stderr.count("out of memory at run time") == 1 and "during step 2" in r.stderr,
      "out of memory in step 2 with offload: exit 7, one report")
check("host        --offload optimizer:" in r.stderr and
      "--offload optimizer --gpu-mem" in r.stderr,
      "the report names the host memory and its plan --fit command keeps --offload optimizer")
r = mpi_env(1, {"ST_FAULT_ARENA_SHORT": "1"},
            base + ["--steps", 1, "--offload", "optimizer", "--out", W("short")], rc=7)
check("did not fit in the arena" in r.stderr and not os.path.exists(W("short")),
      "an arena short of the plan with offload: exit 7 at setup, nothing written")
print("PASS")
