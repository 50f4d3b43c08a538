"""`shardtrain plan`: the table and --json agree with a second, independent
derivation of the memory model (below, written from docs/memory.md, not
from rank/memory/memory_plan.c), exit codes 0 / 6 / 2, --fit's choices, and bad
input named by flag. One process, no MPI, no GPU needed."""
import json
import os
import re

from common import check, corpus, parse_args, run, train

a = parse_args()
GiB = 1 << 30


def al(x):
    return (x + 255) // 256 * 256


def head_rows(BT, Vp, es):
    """The LM head's chunk (docs/memory.md): every row when [BT, Vp] fits
    256 MiB, else the more of what fits 256 MiB and a floor of 2048 rows,
    raised to BT / 8 up to 4096 (fewer when the floor passes 2 GiB), a
    multiple of 128 and at least 128."""
    budget, cap = 256 << 20, 2 << 30
    if BT * Vp * es <= budget:
        return BT
    r = budget // (Vp * es) // 128 * 128
    floor = min(max(2048, BT // 8 // 128 * 128), 4096)
    r = max(r, min(floor, cap // (Vp * es) // 128 * 128), 128)
    return min(BT, r)


def expected(L, NH, C, T, V, B, N, zero, rec, es=2, cuda=True, cudnn=True, accum=0,
             grad16=False):
    """Bytes per GPU as docs/memory.md derives them; every buffer takes
    whole 256-byte units of the arena. es=2 is bf16, whose fp32 master is
    kept split: the working weights and a 2-byte rest each. grad16:
    --grad-dtype bf16 (ZeRO 2 at one micro-step: a 2-byte shard)."""
    Vp = (V + 127) // 128 * 128
    block = 12 * C * C + 13 * C
    P = Vp * C + T * C + L * block + 2 * C
    Pp = -(-P // N) * N
    shard = Pp // N
    grad16 = grad16 and zero == 2 and accum == 1
    if zero == 2:
        # receive buffers only with more than one micro-step a step, or a
        # bf16 shard on several ranks (reduced in fp32, then rounded)
        recv = accum != 1 or (grad16 and N > 1)
        ranges = (block, block, Vp * C + T * C, 2 * C) if recv else ()
        # one bucket on one rank (nothing overlaps there), two on several
        grads = al(4 * (Vp * C + T * C + 2 * C)) + (1 if N == 1 else 2) * al(4 * (block + 1)) + \
            sum(al(4 * (min(r, shard) + 1)) for r in ranges)
    else:
        grads = al(4 * Pp)
    nopt = Pp if zero == 0 else shard
    gs = 2 if grad16 else 4
    gshard = al(gs * shard) if zero == 2 or (zero == 1 and N > 1) else 0  # ZeRO 1, one rank: in place
    states = al(Pp * es) + grads + gshard + (al(2 * nopt) if es == 2 else 0) + 2 * al(4 * nopt)
    BT = B * T
    X, X3, X4, S = al(BT * C * es), al(3 * BT * C * es), al(4 * BT * C * es), al(4 * BT)
    A = al(4 * (B * NH * T if cuda else B * NH * T * T))
    # the 12 per-block buffers of model_layout.c's BLOCK_FIELDS, then residual3
    # (the two projections write into the residual stream: no buffer of their own)
    ln1, stats, qkv, atty, att, res2, ln2, fch, fch_gelu = X, 4 * S, X3, X, A, X, X, X4, X4
    every = ln1 + stats + qkv + atty + att + res2 + ln2 + fch + fch_gelu
    shared = {"none": 0, "act": fch_gelu, "selective": ln1 + ln2 + fch_gelu, "full": every}[rec]
    per_layer = X + (every - shared)
    # backward scratch: dres, dln, then one buffer for the MLP's dfch (4 X)
    # that the attention's dqkv (3 X, rounded to 256) and datty (X) reuse
    # backward scratch: dln, and inside the logits chunk's region dres and
    # one buffer for the MLP's dfch (4 X) that the attention's dqkv (3 X,
    # rounded to 256) and datty (X) reuse
    dshared = al(max(4 * BT * C * es, al(3 * BT * C * es) + BT * C * es))
    acts = X + L * per_layer + shared + (X + 3 * S) + X + \
        al(max(head_rows(BT, Vp, es) * Vp * es, X + dshared)) + A
    other = 2 * al(BT * 4)
    arena = states + acts + other
    if cuda:
        rows = max(128, (BT + 1023) // 1024)
        chunks = -(-BT // rows)
        # cuda_scratch's requests in one step: column sums of ln_f, then of one
        # block's fcproj, fc, ln_2, attproj, qkv, ln_1; then 512 doubles
        s = 0
        for req in [chunks * w * 4 for w in (2 * C, C, 4 * C, 2 * C, C, 3 * C, 2 * C)] + [4096]:
            if req > s:
                s = max(2 * s, req, 1 << 20)
        # 32 channel-equivalents, plus 2 per CTA of the split communicator
        # that reduces gradients during backward (--nccl-overlap-ctas 4; ZeRO 1, 2)
        channels = 32 + (2 * 4 if zero > 0 else 0)
        nccl = 0 if N < 2 else channels * min(N - 1, 2) * ((4 << 20) + 524288 + 4915200)
        # cuDNN's deterministic attention backward: dP (NH x T64^2, 2 bytes)
        # and NH x T fp32 row sums per sequence (docs/memory.md)
        T64 = (T + 63) // 64 * 64
        ws = al(B * (NH * T64 * T64 * 2 + NH * T * 4)) if cudnn and es == 2 else 0
        arena += (32 << 20) + al(s) + ws
        # calibrated on an H200: the context 541 MiB, and a communicator's
        # 576 MiB where one is made (two ranks and more)
        other += (32 << 20) + al(s) + ws + nccl + ((541 + (576 if N > 1 else 0)) << 20)
    return dict(params=P, acts=acts, arena=arena, total=states + acts + other)


def plan(args, rc=0, env=None):
    return run([a.bin, "plan"] + [str(x) for x in args], env=env, expect_rc=rc)


def plan_json(args, rc=0, env=None):
    return json.loads(plan(args + ["--json"], rc, env).stdout)


# 1. GPT-2 124M, bf16, B=32, T=1024: every ZeRO stage and recompute policy on
#    1 and 2 ranks, against the derivation above.
base = ["--model", "gpt2-124m", "--seq-len", 1024, "--micro-batch", 32, "--device", "cuda",
        "--precision", "bf16", "--attention", "cudnn"]
for N, acc in ((1, 1), (2, 1), (2, 2)):
    for z in (0, 1, 2):
        for rec in ("none", "act", "selective", "full"):
            d = plan_json(base + ["--ranks", N, "--global-batch", 32 * N * acc, "--zero", z,
                                  "--recompute", rec])
            e = expected(12, 12, 768, 1024, 50257, 32, N, z, rec, accum=acc)
            check(d["model"]["params"] == e["params"] == 124475904,
                  f"124M N={N} ZeRO {z} {rec}: 124,475,904 parameters")
            check(d["bytes"]["activations"] == e["acts"] and d["bytes"]["total"] == e["total"] and
                  d["bytes"]["arena"] == e["arena"],
                  f"124M N={N} ZeRO {z} {rec}: total {d['bytes']['total']} = "
                  f"{d['bytes']['total'] / GiB:.2f} GiB as derived")
            check(d["activations"]["logits_rows"] == head_rows(32 * 1024, 50304, 2) == 4096,
                  f"124M N={N} ZeRO {z} {rec}: the logits are a chunk of 4,096 of 32,768 rows")
            check(d["gpu"]["fits"] is None or isinstance(d["gpu"]["fits"], bool),
                  f"124M N={N} ZeRO {z} {rec}: gpu.fits is a bool or null")
# --grad-dtype bf16 at ZeRO 2, one micro-step a step, on 1 and 2 ranks
for N in (1, 2):
    d = plan_json(base + ["--ranks", N, "--global-batch", 32 * N, "--zero", 2, "--recompute",
                          "none", "--grad-dtype", "bf16"])
    e = expected(12, 12, 768, 1024, 50257, 32, N, 2, "none", accum=1, grad16=True)
    check(d["bytes"]["total"] == e["total"] and d["bytes"]["arena"] == e["arena"] and
          d["config"]["grad_dtype"] == "bf16",
          f"124M N={N} ZeRO 2 --grad-dtype bf16: total {d['bytes']['total']} as derived")

d = plan_json(base + ["--global-batch", 32, "--attention", "flash"])
e = expected(12, 12, 768, 1024, 50257, 32, 1, 1, "none", cudnn=False)
check(d["bytes"]["total"] == e["total"] and d["bytes"]["cudnn_attention_workspace"] == 0,
      "--attention flash: no cuDNN workspace in the plan")
d = plan_json(base + ["--global-batch", 32])
check(d["bytes"]["cudnn_attention_workspace"] == 806879232,
      "--attention cudnn, bf16, B=32, T=1024: cuDNN's 769.5 MiB workspace, as cuDNN 9.14 reported it on an H200")

# --attention auto at head size 64 (GPT-2's): cuDNN's forward and our
# backward (mixed) from the start, with or without a budget: on Hopper our
# backward is the faster there and O(T) (st_attention_auto_mixed)
auto = base[:-2] + ["--attention", "auto", "--global-batch", 32]
for extra in ([], ["--gpu-mem", "80GiB"]):
    d = plan_json(auto + extra)
    check(d["bytes"]["cudnn_attention_workspace"] == 0 and d["bytes"]["total"] == e["total"]
          and "cuDNN's forward and our backward (mixed), O(T)" in d["attention"]
          and "head size 64" in d["attention"] and d["attention_kernel"] == "mixed",
          f"--attention auto {' '.join(extra)}, head size 64: mixed, no cuDNN workspace")
# --attention mixed: as asked, no workspace whatever the budget
for extra in ([], ["--gpu-mem", "80GiB"]):
    d = plan_json(base[:-2] + ["--attention", "mixed", "--global-batch", 32] + extra)
    check(d["bytes"]["cudnn_attention_workspace"] == 0 and d["bytes"]["total"] == e["total"]
          and d["attention_kernel"] == "mixed" and "as asked" in d["attention"]
          and d["cudnn_seqs_per_call"] == 0,
          f"--attention mixed {' '.join(extra)}: no cuDNN workspace, the kernel named")
# At head size 128 (the same model with 6 heads) auto takes cuDNN's O(T^2)
# workspace only where it fits beside the rest of the plan
# (st_plan_attention_groups); with no budget, mixed.
auto = ["--model", "gpt2-124m", "--heads", 6, "--seq-len", 1024, "--micro-batch", 32,
        "--device", "cuda", "--precision", "bf16", "--attention", "auto", "--global-batch", 32]
e6 = expected(12, 6, 768, 1024, 50257, 32, 1, 1, "none", cudnn=False)
WS6 = 806879232 // 2  # 6 heads: half of 12 heads' workspace
d = plan_json(auto)
check(d["bytes"]["cudnn_attention_workspace"] == 0 and d["bytes"]["total"] == e6["total"]
      and "cuDNN's forward and our backward (mixed), O(T)" in d["attention"]
      and "only a budget" in d["attention"] and d["attention_kernel"] == "mixed",
      "--attention auto, head size 128, no budget: mixed, no cuDNN workspace")
d = plan_json(auto + ["--gpu-mem", "80GiB"])
check(d["bytes"]["cudnn_attention_workspace"] == WS6 and "cuDNN" in d["attention"]
      and d["attention_kernel"] == "cudnn" and d["gpu"]["fits"] is True,
      "--attention auto, head size 128, 80 GiB: cuDNN's workspace fits, cuDNN runs")
# a budget between the plan with ours and the plan with cuDNN's whole
# workspace: the backward runs in groups of sequences, the largest group
# whose workspace fits (16 of the 32: half of it)
tight = (e6["total"] + WS6 // 2 + 65536) / 0.95
d = plan_json(auto + ["--gpu-mem", f"{int(tight) // 1024}KiB"])
check(d["bytes"]["cudnn_attention_workspace"] == WS6 // 2 and d["gpu"]["fits"] is True
      and "16 sequences a call" in d["attention"] and d["attention_kernel"] == "cudnn"
      and d["cudnn_seqs_per_call"] == 16,
      "--attention auto, head size 128, a budget the whole workspace would overflow: cuDNN in "
      "groups of 16 sequences, half the workspace, and the plan fits")
# room for less than the smallest group auto takes (16 sequences at 6
# heads: 768 tiles of 128 rows a call): mixed
tight = (e6["total"] + WS6 // 4) / 0.95
d = plan_json(auto + ["--gpu-mem", f"{int(tight) // 1024}KiB"])
check(d["bytes"]["cudnn_attention_workspace"] == 0 and d["gpu"]["fits"] is True
      and "does not fit" in d["attention"] and "16 sequences a call" in d["attention"]
      and d["attention_kernel"] == "mixed",
      "--attention auto, head size 128, a budget even 16 sequences' workspace would overflow: "
      "mixed runs and the plan fits")
tight = (e["total"] + 806879232 // 2 + 65536) / 0.95
# --attention cudnn under the same budget: cuDNN still, in groups of 16
d = plan_json(base + ["--global-batch", 32, "--gpu-mem", f"{int(tight) // 1024}KiB"])
check(d["bytes"]["cudnn_attention_workspace"] == 806879232 // 2 and d["gpu"]["fits"] is True
      and "16 sequences a call" in d["attention"],
      "--attention cudnn, a budget the whole workspace would overflow: groups of 16 sequences")
# --attention cudnn with room for 4 sequences': asked for cuDNN, it takes
# groups below the smallest auto takes, down to one sequence a call
tight = (e["total"] + 806879232 // 8 + 65536) / 0.95
d = plan_json(base + ["--global-batch", 32, "--gpu-mem", f"{int(tight) // 1024}KiB"])
check(d["bytes"]["cudnn_attention_workspace"] == 806879232 // 8 and d["gpu"]["fits"] is True
      and "4 sequences a call" in d["attention"],
      "--attention cudnn, a budget only 4 sequences' workspace fits: groups of 4")
# no room for even one sequence's: the whole plan is reported as not
# fitting (exit 6), and the attention line says so
tight = e["total"] / 0.95
d = plan_json(base + ["--global-batch", 32, "--gpu-mem", f"{int(tight) // 1024}KiB"], rc=6)
check(d["bytes"]["cudnn_attention_workspace"] == 806879232 and d["gpu"]["fits"] is False
      and "even for one sequence a call" in d["attention"],
      "--attention cudnn, a budget no group fits: the whole workspace, does not fit (exit 6)")
# ... and by how much it is over at one sequence a call: the budget is the
# plan without cuDNN, so one sequence's workspace (of 32) and no more
m = re.search(r"over by ([\d.]+) (KiB|MiB|GiB) even then", d["attention"])
over = float(m.group(1)) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)] if m else 0
check(abs(over - 806879232 / 32) < 0.02 * 806879232 / 32,
      f"--attention cudnn, no group fits: the line gives the shortfall at one sequence a call "
      f"({d['attention']})")
# ... and what ours would plan instead: the plan without cuDNN's workspace
m = re.search(r"runs ours, O\(T\): a plan of ([\d.]+) (KiB|MiB|GiB)", d["attention"])
ours = float(m.group(1)) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)] if m else 0
check(abs(ours - e["total"]) < 0.01 * e["total"],
      f"--attention cudnn, no group fits: the line gives ours' plan ({d['attention']})")
# the attention line is there for every choice, and cudnn is refused where
# train refuses it
d = plan_json(base[:-2] + ["--attention", "flash", "--global-batch", 32])
check("ours" in d["attention"] and d["attention_kernel"] == "ours"
      and d["cudnn_seqs_per_call"] == 0, "--attention flash: the attention line says ours")
d = plan_json(base + ["--global-batch", 32])
check(d["attention_kernel"] == "cudnn" and d["cudnn_seqs_per_call"] == 32,
      "--attention cudnn without a budget: one call for the 32 sequences")
r = plan(["--model", "gpt2-124m", "--device", "cuda", "--precision", "fp32", "--attention",
          "cudnn", "--global-batch", 32], None)
check(r.returncode == 2 and "bf16 and fp16 only" in r.stderr,
      "--attention cudnn with fp32: exit 2, as train")
r = plan(["--model", "gpt2-124m", "--device", "cpu", "--attention", "cudnn", "--global-batch", 32],
         None)
check(r.returncode == 2 and "needs the CUDA backend" in r.stderr,
      "--attention cudnn on the CPU: exit 2, as train")
for dev, prec, words in (("cpu", "fp32", "--attention mixed needs the CUDA backend"),
                         ("cuda", "fp32", "--attention mixed: cuDNN's fused attention runs bf16")):
    r = plan(["--model", "gpt2-124m", "--device", dev, "--precision", prec, "--attention", "mixed",
              "--global-batch", 32], None)
    check(r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1,
          f"--attention mixed, {dev} {prec}: exit 2, one line ({r.stderr.strip()[:100]})")
# a head size nothing on the GPU runs: refused as train's setup refuses it
# (exit 2, the same words), while the CPU's reference takes any
wide = ["--model", "tiny", "--layers", 2, "--heads", 1, "--dim", 256, "--global-batch", 8]
for att in ("flash", "auto", "cudnn", "mixed"):
    r = plan(wide + ["--device", "cuda", "--precision", "bf16", "--attention", att], None)
    check(r.returncode == 2 and "head size 256" in r.stderr and "more heads" in r.stderr
          and r.stderr.count("\n") == 1,
          f"head size 256, --attention {att}: one line, exit 2 ({r.stderr.strip()[:120]})")
r = plan(wide + ["--device", "cuda", "--precision", "fp32"], None)
check(r.returncode == 2 and "no attention kernel of ours" in r.stderr,
      "head size 256 in fp32 on CUDA: exit 2, our kernels named")
r = plan(["--model", "tiny", "--layers", 2, "--heads", 2, "--dim", 72, "--global-batch", 8,
          "--device", "cuda", "--precision", "bf16", "--attention", "cudnn"], None)
check(r.returncode == 2 and "multiple of 8" in r.stderr and "--attention flash" in r.stderr,
      "head size 36 with --attention cudnn: exit 2, the fix named")
r = plan(["--model", "tiny", "--layers", 2, "--heads", 2, "--dim", 72, "--global-batch", 8,
          "--device", "cuda", "--precision", "bf16", "--attention", "mixed"], None)
check(r.returncode == 2 and "--attention mixed" in r.stderr and "multiple of 8" in r.stderr,
      "head size 36 with --attention mixed: exit 2 (cuDNN runs its forward), the fix named")
r = plan(["--model", "tiny", "--layers", 2, "--heads", 2, "--dim", 72, "--global-batch", 8,
          "--device", "cuda", "--precision", "bf16", "--attention", "auto"], None)
check(r.returncode in (0, 6), "head size 36 with --attention auto: ours plan it")
d = plan_json(["--model", "tiny", "--layers", 2, "--heads", 2, "--dim", 72, "--global-batch", 8,
               "--device", "cuda", "--precision", "bf16", "--attention", "auto"], rc=None)
check(d is not None and d["attention_kernel"] == "ours",
      "head size 36 with --attention auto: ours both ways (cuDNN takes no head size 36)")
# ... under a budget too: no cuDNN workspace planned, the line says why
d = plan_json(["--model", "tiny", "--layers", 2, "--heads", 2, "--dim", 72, "--global-batch", 8,
               "--device", "cuda", "--precision", "bf16", "--attention", "auto",
               "--gpu-mem", "80GiB"], rc=None)
check(d is not None and d["attention_kernel"] == "ours"
      and d["bytes"]["cudnn_attention_workspace"] == 0 and "multiples of 8" in d["attention"],
      "head size 36 with --attention auto and 80 GiB: ours, no cuDNN workspace planned")
r = plan(wide + ["--device", "cpu"], None)
check(r.returncode in (0, 6), "head size 256 on the CPU: the reference plans it")
check(re.search(r"^  attention +the CPU reference", r.stdout, re.M) is not None,
      "plan --device cpu: the table has the attention line, as --json has")
# --fit at T=65536 under 24 GiB: the workspace (24 GiB per sequence) never
# crowds out the search, which finds micro-batch 1 with ours
d = plan_json(["--model", "gpt2-124m", "--seq-len", 65536, "--global-batch", 1, "--device", "cuda",
               "--precision", "bf16", "--gpu-mem", "24GiB", "--fit"])
check(d["fit"]["found"] and d["bytes"]["cudnn_attention_workspace"] == 0,
      "--fit, GPT-2 124M at T=65536 under 24 GiB: fits with ours (O(T) attention)")

# One rank makes no NCCL communicator unless ST_NCCL_ONE_RANK=1 (train
# reads the same variable the same way): then its 576 MiB are in the
# context row; any other value is refused, naming the variable.
one = base + ["--ranks", 1, "--global-batch", 32]
d0 = plan_json(one)
d1 = plan_json(one, env={"ST_NCCL_ONE_RANK": "1"})
check(d0["bytes"]["cuda_context_estimate"] == 541 << 20 and
      d1["bytes"]["cuda_context_estimate"] == 1117 << 20 and
      d1["bytes"]["total"] - d0["bytes"]["total"] == 576 << 20,
      "one rank: context 541 MiB, 1117 with ST_NCCL_ONE_RANK=1 (a communicator's 576)")
r = plan(one, rc=2, env={"ST_NCCL_ONE_RANK": "yes"})
check("ST_NCCL_ONE_RANK='yes'" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      "ST_NCCL_ONE_RANK=yes: exit 2, one line naming the variable")

# bf16 keeps its fp32 master split: the working weights are the high
# halves, 2-byte rests the rest (kernels/master_split.h); ST_MASTER_FP32=1
# keeps a whole fp32 copy (2 bytes a parameter more), fp16 always does.
d0 = plan_json(one + ["--zero", 0])
d1 = plan_json(one + ["--zero", 0], env={"ST_MASTER_FP32": "1"})
d2 = plan_json(one + ["--zero", 0, "--precision", "fp16"])
P = d0["model"]["params"]
check(d0["bytes"]["master"] == al(2 * P) and d1["bytes"]["master"] == al(4 * P) and
      d2["bytes"]["master"] == al(4 * P) and
      d1["bytes"]["total"] - d0["bytes"]["total"] == al(4 * P) - al(2 * P),
      "bf16: master 2 bytes a parameter (split); 4 with ST_MASTER_FP32=1 and with fp16")
r = plan(one + ["--zero", 0])
check("master weights, low halves" in r.stdout and "fp32 master weights" not in r.stdout,
      "bf16: the table names the split master's row")
r = plan(one, rc=2, env={"ST_MASTER_FP32": "on"})
check("ST_MASTER_FP32='on'" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      "ST_MASTER_FP32=on: exit 2, one line naming the variable")

# The gradient-overlap communicator's NCCL memory: 2 channel-equivalents per
# CTA, none at ZeRO 0 or with --nccl-overlap-ctas 0, capped by --nccl-max-ctas.
conn = (4 << 20) + 524288 + 4915200  # one channel's connection to one peer
for extra, z, channels in (([], 1, 32 + 8), ([], 0, 32), (["--nccl-overlap-ctas", 0], 2, 32),
                           (["--nccl-overlap-ctas", 16], 1, 32 + 32),
                           (["--nccl-max-ctas", 2], 1, 2 + 4)):
    d = plan_json(base + ["--ranks", 2, "--global-batch", 64, "--zero", z] + extra)
    check(d["bytes"]["nccl_estimate"] == channels * conn,
          f"2 ranks, ZeRO {z} {' '.join(map(str, extra))}: NCCL estimate of {channels} channels")

# The CPU backend: fp32, the T x T softmax per head, no CUDA internals.
d = plan_json(["--model", "tiny", "--seq-len", 32, "--vocab-size", 256, "--device", "cpu",
               "--micro-batch", 2, "--global-batch", 4, "--zero", 2, "--ranks", 2,
               "--recompute", "selective"])
e = expected(2, 4, 64, 32, 256, 2, 2, 2, "selective", es=4, cuda=False, accum=1)
check(d["bytes"]["total"] == e["total"] and d["config"]["precision"] == "fp32",
      "CPU plan of the tiny model as derived (fp32, T x T attention state)")
check(d["gpu"]["fits"] is None, "CPU plan without --gpu-mem: not checked, fits is null")

# 2. Exit codes: fits 0, does not fit 6, and the table says which.
r = plan(base + ["--global-batch", 32, "--gpu-mem", "80GiB"], rc=0)
check("fits," in r.stdout and "to spare" in r.stdout, "80 GiB: fits, exit 0")
r = plan(base + ["--global-batch", 32, "--gpu-mem", "8GiB"], rc=6)
check("DOES NOT FIT" in r.stdout and "over by" in r.stdout, "8 GiB: DOES NOT FIT, exit 6")
d = plan_json(base + ["--global-batch", 32, "--gpu-mem", "8GiB"], rc=6)
check(d["gpu"]["fits"] is False and d["gpu"]["spare"] < 0, "--json: fits false, spare < 0")
check(d["gpu"]["usable"] == 8 * GiB - int(8 * GiB * 0.05 + 0.999), "usable = 8 GiB less 5%")
r = plan(base + ["--global-batch", 32, "--gpu-mem", "12GB", "--headroom", "0"], rc=6)  # needs 13.9 GiB
check("less 0% headroom" in r.stdout, "--headroom 0 shown")

# 3. --fit: the choices the unit test derives, in the text and in JSON.
fit = ["--seq-len", 2048, "--global-batch", 32, "--gpu-mem", "24GiB", "--fit"]
# 774M on one rank: 4 sequences with act recompute take 20.96 of 22.80 GiB
# usable (the logits one LM-head chunk of 2,560 rows, the master split, no
# NCCL communicator), with selective 19.59; 32 with full take 21.35.
r = plan(["--model", "gpt2-774m"] + fit, rc=0)
check("choice  micro-batch 4 x grad-accum 8, recompute act, ZeRO 0 (cost 1.07)" in r.stdout,
      "774M, 1 rank, 24 GiB: micro-batch 4 with act recompute (cost 1.07), as the unit test")
check("recompute none at micro-batch 4 would cost 1.05 but does not fit" in r.stdout,
      "774M: says why not micro-batch 4 without recompute")
check("recompute none: the best that fits is micro-batch 2 x grad-accum 16, ZeRO 0" in r.stdout
      and "cost 1.10, more than 1.07" in r.stdout,
      "774M: no recompute fits at 2 but costs more")
check("recompute selective: the best that fits is micro-batch 4 x grad-accum 8, ZeRO 0" in r.stdout
      and "cost 1.08, more than 1.07" in r.stdout,
      "774M: selective fits at 4 too but costs more than act")
check("recompute full: the best that fits is micro-batch 32 x grad-accum 1, ZeRO 0" in r.stdout
      and "cost 1.21, more than 1.07" in r.stdout,
      "774M: full recompute fits at 32 (cuDNN's O(T^2) workspace grows with it) but costs more")
check("train with: --micro-batch 4 --global-batch 32 --recompute act --zero 0" in r.stdout
      and "--auto-fit-zero" in r.stdout, "774M: prints the train flags")
d = plan_json(["--model", "gpt2-774m", "--ranks", 8] + fit)
c = d["fit"]["choice"]
check((c["micro_batch"], c["recompute"], c["zero"]) == (4, "none", 1) and d["config"]["zero"] == 1,
      "774M, 8 ranks: micro-batch 4, no recompute, ZeRO 1 (JSON)")
check(d["fit"]["lower_zero"]["fits"] is False, "774M, 8 ranks: ZeRO 0 reported as not fitting")
r = plan(["--model", "gpt2-1558m", "--zero", 0] + fit, rc=6)
check("NOTHING FITS" in r.stdout, "1558M, 1 rank, 24 GiB, --zero 0: nothing fits, exit 6")
d = plan_json(["--model", "gpt2-1558m", "--zero", 0] + fit, rc=6)
check(d["fit"]["found"] is False and d["fit"]["least"]["micro_batch"] == 1,
      "1558M, 1 rank: JSON names the least-memory candidate")
# the stage searched: the optimizer state goes to the host (--offload optimizer)
r = plan(["--model", "gpt2-1558m"] + fit, rc=0)
check("offload optimizer (cost" in r.stdout and "--offload optimizer adds" in r.stdout
      and "offloaded to host" in r.stdout,
      "1558M, 1 rank, 24 GiB, stage searched: fits with the optimizer offloaded, and says what it costs")
d = plan_json(["--model", "gpt2-1558m"] + fit)
c = d["fit"]["choice"]
check(c["offload"] == "optimizer" and c["fits"] is True and d["host"]["total"] > 12 * d["model"]["params"],
      "1558M, 1 rank (JSON): offload optimizer, its host section holds master, m and v")
d = plan_json(["--model", "gpt2-1558m", "--ranks", 8] + fit)
c = d["fit"]["choice"]
check((c["micro_batch"], c["recompute"], c["zero"]) == (4, "act", 2),
      "1558M, 8 ranks: micro-batch 4, act recompute, ZeRO 2 (cost 1.07 < selective at 4, 1.08, "
      "none at 2, 1.10, and full at 4, 1.26)")
d = plan_json(["--model", "gpt2-1558m", "--ranks", 8, "--zero", 2] + fit)
check(d["fit"]["choice"]["zero"] == 2 and d["fit"]["zero_searched"] is False,
      "--zero given: kept, not searched")
d = plan_json(["--model", "gpt2-1558m", "--ranks", 8, "--micro-batch", 2] + fit)
check(d["fit"]["choice"]["micro_batch"] == 2, "--micro-batch bounds the search")

# 4. Bad input: exit 2, one message naming the flag.
for args, words in [
        (["--gpu-mem", "24"], ["--gpu-mem", "unit"]),
        (["--zero", "4"], ["--zero"]),
        (["--ranks", "0"], ["--ranks"]),
        (["--micro-batch", "3", "--global-batch", "16"], ["--global-batch 16", "--micro-batch 3"]),
        (["--device", "cpu", "--precision", "bf16"], ["--precision bf16", "CPU"]),
        (["--heads", "5", "--dim", "64"], ["--dim 64", "--heads 5"]),
        (["--headroom", "100"], ["--headroom"]),
        (["--nccl-overlap-ctas", "65"], ["--nccl-overlap-ctas", "[0, 64]"]),
        (["--data", "x.h5"], ["--data is a train flag that plan does not take"]),
        (["--model", "gpt2-774m", "--fitt"], ["unknown flag '--fitt'", "did you mean --fit?"]),
        (["--model", "gpt2-774m", "--seq-len"], ["flag --seq-len needs a value"]),
        (["--fit", "--ranks", "3", "--global-batch", "16", "--gpu-mem", "1GiB"],
         ["--global-batch 16", "3 ranks"]),
        (["--seq-len", "4096", "--micro-batch", "600000", "--global-batch", "600000"],
         ["--micro-batch 600000", "--seq-len 4096"])]:
    r = plan(args, rc=2)
    msg = r.stderr.strip()
    check(msg.count("shardtrain: error") == 1 and all(w in msg for w in words),
          f"plan {' '.join(args)}: exit 2, '{msg[:90]}...'")
r = plan(["--help"])
check("--fit" in r.stdout and "--gpu-mem" in r.stdout, "plan --help lists --fit and --gpu-mem")
r = run([a.bin, "--help"])
check("shardtrain plan" in r.stdout, "shardtrain --help lists plan")

# 5. The wording follows the device: on --device cpu the plan is of one CPU
#    rank's host memory, never "per GPU"; a plan that does not fit names the
#    smallest change that fits (the one train's pre-flight names for the same
#    flags) and points at --fit.
cpu = ["--model", "tiny", "--seq-len", 32, "--vocab-size", 256, "--device", "cpu",
       "--micro-batch", 8, "--global-batch", 16, "--headroom", 0]
r = plan(cpu)
check("GPU" not in r.stdout and "per CPU rank" in r.stdout and
      "memory per CPU rank: not checked" in r.stdout,
      "plan --device cpu: the table is per CPU rank and never says GPU")
need = plan_json(cpu)["bytes"]["total"]
r = plan(cpu + ["--gpu-mem", f"{need + 4096}B"])
check("GPU" not in r.stdout and "memory per CPU rank" in r.stdout and "fits," in r.stdout,
      "plan --device cpu --gpu-mem: 'memory per CPU rank ... fits', no GPU")
r = plan(cpu + ["--fit", "--gpu-mem", f"{need + 4096}B"])
check("GPU" not in r.stdout and "usable per CPU rank" in r.stdout,
      "plan --device cpu --fit: 'usable per CPU rank', no GPU")
r = plan(base + ["--global-batch", 32])
check("per GPU" in r.stdout, "plan --device cuda: still per GPU")

tight = f"{need * 3 // 4}B"
r = plan(cpu + ["--gpu-mem", tight], rc=6)
check("GPU" not in r.stdout and "DOES NOT FIT" in r.stdout, "cpu, 3/4 of the plan: DOES NOT FIT, no GPU")
check("Add --fit to these flags" in r.stdout, "DOES NOT FIT suggests --fit")
change = [l for l in r.stdout.splitlines() if l.startswith("The smallest change that fits: ")]
check(len(change) == 1 and ("--micro-batch 8 -> " in change[0] or "--recompute none -> " in change[0]),
      f"DOES NOT FIT names the smallest change: {change}")
named = change[0][len("The smallest change that fits: "):].rsplit(" (plan ", 1)[0]
data = corpus(a)
t = train(a, 1, ["--data", data, "--out", os.path.join(a.work, "tight"), "--steps", 1,
                 "--gpu-mem", tight] + [str(x) for x in cpu[:6] + cpu[8:]], expect_rc=6)
check(f"The smallest change that fits: {named} (plan" in t.stderr,
      f"train's pre-flight names the same change as plan: {named}")
# 124M at 32 x 1024 needs 12.7 GiB; with full recompute 4.96 GiB (its
# logits one 393 MiB chunk), which 8 GiB holds at the same micro-batch.
r = plan(base + ["--global-batch", 32, "--gpu-mem", "8GiB"], rc=6)
check("The smallest change that fits: --recompute none -> full (plan 4.96 GiB)" in r.stdout and
      "Add --fit to these flags" in r.stdout,
      "124M in 8 GiB: names the smallest change (full recompute) and suggests --fit")
r = plan(["--model", "gpt2-1558m", "--seq-len", 2048, "--global-batch", 32, "--gpu-mem", "24GiB"], rc=6)
check("The smallest change that fits:" in r.stdout and "--offload none -> optimizer" in r.stdout
      and "--fit" in r.stdout,
      "1558M in 24 GiB: nothing fits on the GPU alone; the smallest change offloads the optimizer")
d = plan_json(base + ["--global-batch", 32, "--gpu-mem", "8GiB"], rc=6)
check(d["gpu"]["fits"] is False, "--json stays one JSON object when it does not fit")
