"""train --zero 3 (each rank keeps 1/N of the block weights, gathered per
block before its forward and backward) on the CPU backend, MPI ranks:

(a) ZeRO 3 on mpirun -np 1, 2, 3 and 4 is bit-identical to ZeRO 2 on the
    same ranks: the final fp32 weights (--dump-params), every training loss
    and every validation loss (a gather copies bits, and the gradients take
    ZeRO 2's path), with gradient accumulation (global batch 12 of
    micro-batch 2: 6, 3, 2 micro-steps; at 4 ranks global batch 8, 1
    micro-step) and validation every 2 steps over an uneven number of
    micro-batches per rank (at 3 and 4 ranks some ranks run a forward that
    does not count, so they join every gather); also with --recompute full
    and for a Llama-shaped model (untied head) on 3 ranks. Against ZeRO 0 and 1 the
    order of fp32 sums differs (ZeRO 0/1 accumulate micro-steps before
    reducing, ZeRO 2/3 reduce each one), so there the tolerance is
    test_ranks_agree's: every loss within 1e-5 of ZeRO 0 on one rank. With
    one micro-step per step ZeRO 1 and 3 sum in the same order: bit-exact.
(b) resume across stages and rank counts: ZeRO 3 x 3 ranks -> ZeRO 1 x 2,
    ZeRO 1 x 2 -> ZeRO 3 x 4, ZeRO 3 x 4 -> ZeRO 0 x 1 and ZeRO 2 x 1 ->
    ZeRO 3 x 3 give the uninterrupted run's losses (within 1e-5: the rank
    counts change the order of sums); ZeRO 3 -> ZeRO 3 on the same ranks is
    bit-exact with the uninterrupted run; a NaN in a ZeRO-3 shard
    (ST_FAULT_NAN_STEP) refuses the checkpoint (exit 1) as at other stages.
(c) --zero 3 --offload optimizer (the master shard on the host, chunks of
    1000 elements) is bit-identical to --zero 3 on device, on 2 and 3 ranks;
    a skipped step (ST_FAULT_OVERFLOW) at ZeRO 3 leaves ZeRO 2's weights.
(d) plan --zero 3: the working weights are the shard, the head whole and
    two block buffers, each as allocated (256-byte units); plan --fit chooses
    ZeRO 3 for llama-3.1-8b on 8 ranks of 40 GiB, where ZeRO 2 does not fit,
    and says why; the configuration block of a ZeRO-3 run says what is
    sharded."""
import json
import os

from common import check, corpus, losses, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 2,
        "--lr", 1e-3, "--warmup", 2, "--val-seqs", 10, "--val-every", 2, "--resume", "none"]


def val_losses(run_dir):
    out = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        d = json.loads(line)
        if "val_loss" in d:
            out[d["step"]] = d["val_loss"]
    return out


def same(x, y, what):
    p, q = open(x, "rb").read(), open(y, "rb").read()
    check(len(p) > 0 and p == q, what)


def mpi_env(np_, env, args, rc=0):
    """train with env passed to every rank (-x)."""
    xs = sum((["-x", k] for k in env), [])
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(np_)] + xs + [a.bin, "train", "--device", "cpu"] + [str(x) for x in args]
    return run(cmd, env=env, expect_rc=rc)


def close(got, ref, what, tol=1e-5):
    check(sorted(got) == sorted(ref), f"{what}: the same steps logged")
    d = max(abs(got[s] - ref[s]) for s in ref)
    check(d <= tol, f"{what}: max |loss - reference| = {d:.3g} <= {tol}")
    return d


# (a) ZeRO 3 against ZeRO 2 (bit-exact) and ZeRO 0 on one rank (1e-5)
ref = {}
for gb in (12, 8):
    out = W(f"ref_gb{gb}")
    train(a, 1, base + ["--global-batch", gb, "--steps", 4, "--zero", 0, "--out", out])
    ref[gb] = (losses(out), val_losses(out))
    check(len(ref[gb][1]) == 2, "the reference validated at steps 2 and 4")
worst = 0.0
for np_ in (1, 2, 3, 4):
    gb = 8 if np_ == 4 else 12
    runs = {}
    for zero in (2, 3):
        out = W(f"z{zero}_np{np_}")
        r = train(a, np_, base + ["--global-batch", gb, "--steps", 4, "--zero", zero, "--out", out,
                                  "--dump-params", out + ".f32"])
        runs[zero] = (out, r)
    (o2, _), (o3, r3) = runs[2], runs[3]
    same(o2 + ".f32", o3 + ".f32", f"np={np_}: ZeRO 3's final weights bit-identical to ZeRO 2's")
    check(losses(o2) == losses(o3) and val_losses(o2) == val_losses(o3),
          f"np={np_}: every training and validation loss identical to ZeRO 2's")
    worst = max(worst, close(losses(o3), ref[gb][0], f"np={np_} ZeRO 3 vs np=1 ZeRO 0"))
    close(val_losses(o3), ref[gb][1], f"np={np_} ZeRO 3 validation vs np=1 ZeRO 0")
    if np_ > 1:
        check("zero       stage 3: weights, gradient and Adam m/v shards of 1/N" in r3.stdout,
              f"np={np_}: the configuration block says what ZeRO 3 shards")
        j = [json.loads(l) for l in open(os.path.join(o3, "metrics.jsonl")) if "memory_plan" in l]
        b = j[0]["memory_plan"]["bytes"]
        check(b["weights"] == b["weights_shard"] + b["weights_head"] + b["weights_blocks"] and
              b["weights_shard"] > 0, f"np={np_}: the run's plan counts the shard, head, blocks")
print(f"largest difference of ZeRO 3 from one-rank ZeRO 0: {worst:.3g}")
# one micro-step per step: ZeRO 1 sums as ZeRO 3 does
for zero in (1, 3):
    out = W(f"acc1_z{zero}")
    train(a, 2, base + ["--global-batch", 4, "--steps", 3, "--zero", zero, "--out", out,
                        "--dump-params", out + ".f32"])
same(W("acc1_z1.f32"), W("acc1_z3.f32"),
     "one micro-step per step, 2 ranks: ZeRO 3 bit-identical to ZeRO 1")

# full recompute (the block reruns from the gathered buffer) and a Llama-shaped
# model (RMSNorm, RoPE, GQA, SwiGLU, an untied lm_head kept whole with wte)
variants = {"full": ["--recompute", "full"],
            "llama": ["--arch", "llama", "--layers", 3, "--heads", 4, "--kv-heads", 2, "--dim", 64,
                      "--tied", 0]}
for name, extra in variants.items():
    for zero in (2, 3):
        out = W(f"{name}_z{zero}")
        args = [x for x in base if x not in ("--model", "tiny")] if name == "llama" else base
        train(a, 3, args + extra + ["--global-batch", 12, "--steps", 3, "--zero", zero,
                                    "--out", out, "--dump-params", out + ".f32"])
    same(W(f"{name}_z2.f32"), W(f"{name}_z3.f32"),
         f"{name}, 3 ranks: ZeRO 3 bit-identical to ZeRO 2")
    check(losses(W(f"{name}_z2")) == losses(W(f"{name}_z3")), f"{name}: every loss identical")

# (b) resume across stages and rank counts
rb = base + ["--global-batch", 24, "--steps", 6, "--ckpt-every", 3]
full = W("res_full")
train(a, 2, rb + ["--zero", 1, "--out", full])
# (stage, ranks) -> (stage, ranks): fewer and more ranks, every stage on one side
for first, second in (((3, 3), (1, 2)), ((1, 2), (3, 4)), ((3, 4), (0, 1)), ((2, 1), (3, 3))):
    (z1, n1), (z2, n2) = first, second
    out = W(f"res_z{z1}np{n1}_z{z2}np{n2}")
    train(a, n1, rb + ["--zero", z1, "--stop-after", 3, "--out", out])
    r = train(a, n2, rb + ["--zero", z2, "--resume", "auto", "--out", out])
    check("ckpt/step_00000003 at step 3" in r.stdout and "resumed from" in r.stdout,
          f"ZeRO {z1} x {n1} -> ZeRO {z2} x {n2}: resumed from step 3")
    got = losses(out)
    check(sorted(got) == list(range(1, 7)), f"ZeRO {z1} x {n1} -> {z2} x {n2}: steps 1..6 logged")
    close(got, losses(full), f"ZeRO {z1} x {n1} -> ZeRO {z2} x {n2}, against ZeRO 1 x 2 unbroken")
f3 = W("res3_full")
train(a, 2, rb + ["--zero", 3, "--out", f3, "--dump-params", f3 + ".f32"])
o = W("res3_split")
train(a, 2, rb + ["--zero", 3, "--stop-after", 3, "--out", o])
train(a, 2, rb + ["--zero", 3, "--resume", "auto", "--out", o, "--dump-params", o + ".f32"])
same(f3 + ".f32", o + ".f32", "ZeRO 3 stopped at step 3 and resumed: bit-exact final weights")
check(losses(f3) == losses(o), "ZeRO 3 resumed: every loss identical")

o = W("nan3")
r = mpi_env(3, {"ST_FAULT_NAN_STEP": "2:2"}, rb + ["--zero", 3, "--steps", 4, "--ckpt-every", 2,
                                                   "--out", o], rc=1)
err = [l for l in r.stderr.splitlines() if l.startswith("shardtrain")]
check(len(err) == 1 and "NaN or inf" in err[0] and "step 2" in err[0],
      f"ZeRO 3: a NaN in rank 2's shard refuses checkpoint step 2, one line: {err}")
check(not os.path.exists(os.path.join(o, "ckpt", "latest")), "ZeRO 3 NaN: no latest written")

# (c) offload, and a skipped step
CHUNK = {"ST_OFFLOAD_CHUNK": "1000"}
ob = base + ["--global-batch", 12, "--steps", 3]
for np_ in (2, 3):
    outs = []
    for off in ("none", "optimizer"):
        out = W(f"off_np{np_}_{off}")
        r = mpi_env(np_, CHUNK, ob + ["--zero", 3, "--offload", off, "--out", out,
                                      "--dump-params", out + ".f32"])
        if off == "optimizer":
            check("offload    optimizer" in r.stdout, f"np={np_}: the optimizer is offloaded")
        outs.append(out)
    same(outs[0] + ".f32", outs[1] + ".f32",
         f"np={np_}: --zero 3 --offload optimizer bit-identical to --zero 3")
    check(losses(outs[0]) == losses(outs[1]), f"np={np_}: offload, every loss identical")
ov = dict(CHUNK, ST_FAULT_OVERFLOW="2")
for zero in (2, 3):
    out = W(f"skip_z{zero}")
    mpi_env(3, ov, ob + ["--zero", zero, "--out", out, "--dump-params", out + ".f32"])
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    check([d["step"] for d in lines if d.get("skipped")] == [2], f"ZeRO {zero}: step 2 skipped")
same(W("skip_z2.f32"), W("skip_z3.f32"), "a skipped step at ZeRO 3: ZeRO 2's final weights")

# (d) the plan
R = lambda b: (b + 255) // 256 * 256
for ranks in (1, 3):
    j = json.loads(run([a.bin, "plan", "--model", "tiny", "--device", "cpu", "--ranks",
                        str(ranks), "--global-batch", "24", "--zero", "3", "--json"]).stdout)
    j2 = json.loads(run([a.bin, "plan", "--model", "tiny", "--device", "cpu", "--ranks",
                         str(ranks), "--global-batch", "24", "--zero", "2", "--json"]).stdout)
    m, b, b2 = j["model"], j["bytes"], j2["bytes"]
    C, V, L = m["n_embd"], m["padded_vocab_size"], m["n_layer"]
    T = m.get("positions", m["seq_len"])  # rows of wpe
    head = V * C + T * C + 2 * C  # wte, wpe, ln_f weight and bias (GPT-2 tiny, tied)
    block = (m["params"] - head) // L
    check(block * L + head == m["params"], f"ranks {ranks}: the tiny model's table splits")
    check(b["weights_shard"] == R(4 * m["shard"]) and b["weights_head"] == R(4 * head) and
          b["weights_blocks"] == 2 * R(4 * block) and
          b["weights"] == b["weights_shard"] + b["weights_head"] + b["weights_blocks"],
          f"ranks {ranks}: ZeRO 3's weights are shard + head + 2 blocks, 256-byte units: {b}")
    check(b2["weights"] == R(4 * m["padded_params"]) and b2["weights_shard"] == 0,
          f"ranks {ranks}: ZeRO 2's weights are the whole padded vector")
    check(b["total"] - b2["total"] == b["weights"] - b2["weights"],
          f"ranks {ranks}: ZeRO 3 differs from ZeRO 2 by the weights only")
fit = ["plan", "--model", "llama-3.1-8b", "--ranks", "8", "--device", "cuda", "--precision",
       "bf16", "--seq-len", "2048", "--global-batch", "32", "--gpu-mem", "40GiB", "--fit"]
r = run([a.bin] + fit)
check("choice  micro-batch 4 x grad-accum 1, recompute full, ZeRO 3" in r.stdout and
      "ZeRO 2 does not fit" in r.stdout and "ZeRO 3 adds" in r.stdout and
      "--zero 3" in r.stdout, f"plan --fit chooses ZeRO 3 and says why:\n{r.stdout[:3000]}")
j = json.loads(run([a.bin] + fit + ["--json"]).stdout)
fj = j.get("fit", j)
ch, lz = fj["choice"], fj["lower_zero"]
check(ch["zero"] == 3 and ch["fits"] and lz["zero"] == 2 and not lz["fits"],
      f"--json: ZeRO 3 chosen, ZeRO 2 at the same micro-batch does not fit: {ch} {lz}")
r = run([a.bin] + fit[:-3] + ["--gpu-mem", "80GiB", "--fit"])
choice = [l for l in r.stdout.splitlines() if l.startswith("choice")]
check(len(choice) == 1 and "ZeRO 2" in choice[0],
      f"with room for ZeRO 2, the gathers' cost keeps ZeRO 3 out of the choice: {choice}")
print("PASS")
