"""LoRA on a frozen base (issue 20, docs/lora.md), on the CPU: a Llama-shaped
model imported from tests/data/hf/llama-tiny is the base.

- `train --init-from BASE --lora ...` prints the trainable count; the plan's
  gradients and optimizer are the adapters' only; the checkpoint holds only
  the adapters (and their Adam state) plus the LoRA config and the base's
  SHA-256 (index.h5's config, section "lora");
- dropout 0.1, stop after step 4 and resume (same ranks): steps 5-8 and the
  final adapters equal the uninterrupted run bit for bit;
- dropout 0: 1 rank ZeRO 0, 2 ranks ZeRO 2 and 4 ranks ZeRO 1 agree within
  1e-5 per step (only fp32 summation order differs); a 2-rank ZeRO 2
  checkpoint resumes on 1 rank at ZeRO 0 within 1e-5 of the uninterrupted run;
- resume with --init-from a moved copy of the base works; with another base
  of the same shape: exit 4 naming --init-from; bad --lora specs and
  unsupported combinations: exit 2 naming --lora (--lora without --init-from
  is allowed since QLoRA: test_qlora.py).
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import check, losses, parse_args, read_st, run, train  # noqa: E402
from lora_setup import MODEL, prepare  # noqa: E402

a = parse_args()
W, common = prepare(a)
ALL = "targets=q,k,v,o,gate,up,down"


def lora_run(out, np_, zero, spec, *extra, expect_rc=0, base=None):
    return train(a, np_, ["--init-from", base or W("base"), "--lora", spec, "--out", W(out),
                          "--zero", zero] + common + list(extra), expect_rc=expect_rc)


def adapters(run_dir):
    step = open(os.path.join(run_dir, "ckpt", "latest")).read().strip()
    with h5py.File(os.path.join(run_dir, "ckpt", step, "index.h5"), "r") as f:
        names = sorted(f["params"].keys())
        cfg = json.loads(f.attrs["config"])
        return names, {n: f["params"][n][...] for n in names}, cfg


# a fresh run, dropout on: trainable count, plan, checkpoint contents
spec = "4,alpha=16,dropout=0.1," + ALL
r = lora_run("ref", 1, 1, spec)
check("trainable (LoRA 4,alpha=16,dropout=0.1,targets=q,k,v,o,gate,up,down, scale 4)"
      in r.stdout, "the configuration block names the trainable count and the LoRA config")
# per layer: q 4*(64+64), k 4*(64+32), v 4*(64+32), o 4*(64+64), gate/up 4*(64+96), down 4*(96+64)
per_layer = 4 * (128 + 96 + 96 + 128 + 160 + 160 + 160)
check(f"params     {2 * per_layer} trainable" in r.stdout, f"{2 * per_layer} adapter elements")
names, ref_ad, cfg = adapters(W("ref"))
check(all(".lora_" in n for n in names) and len(names) == 2 * 7 * 2,
      f"the checkpoint holds the 28 adapter tensors only: {names[:3]}...")
lora_cfg = cfg.get("lora", {})
check(len(lora_cfg.get("base_sha256", "")) == 64 and lora_cfg.get("trainable_params") ==
      2 * per_layer and lora_cfg.get("spec") == "4,alpha=16,dropout=0.1," + ALL,
      f"the config records the LoRA spec, counts and base digest: {lora_cfg}")
with h5py.File(W("ref", "ckpt", "step_00000008", "index.h5"), "r") as f:
    check(sorted(f["adam_m"].keys()) == names, "Adam state for the adapters only")
ref = losses(W("ref"))
check(ref[8] < ref[1], f"the loss falls: {ref[1]:.4f} -> {ref[8]:.4f}")
plan = None
with open(W("ref", "metrics.jsonl")) as f:
    for line in f:
        d = json.loads(line)
        if "plan" in d:
            plan = d["plan"]
            break

# sample, eval and export of a LoRA run: the base with the adapters merged
def evaluate(src):
    r = run([a.bin, "eval", "--init", src, "--data", W("kjv.h5"), "--seq-len", "32",
             "--max-windows", "4", "--device", "cpu", "--json"])
    return json.loads(r.stdout.strip().splitlines()[-1])["loss"]


val = [json.loads(line)["val_loss"] for line in open(W("ref", "metrics.jsonl"))
       if "val_loss" in json.loads(line)][-1]
got = evaluate(W("ref"))
check(abs(got - val) <= 1e-5, f"eval of the LoRA run (merged) = the trainer's val loss: {got:.6f} "
      f"vs {val:.6f}")
r = run([a.bin, "ckpt", "export", W("ref"), "--out", W("plain")], expect_rc=2)
check("--merge" in r.stderr, "export of a LoRA run without --merge/--lora-format: exit 2")
r = run([a.bin, "ckpt", "export", W("ref"), "--out", W("peft_llmc"), "--lora-format", "peft",
         "--format", "llmc"], expect_rc=2)
check("--format llmc and --lora-format peft" in r.stderr and not os.path.exists(W("peft_llmc")),
      "--lora-format peft with --format llmc: refused (exit 2), nothing written")
run([a.bin, "ckpt", "export", W("ref"), "--out", W("merged"), "--merge"])
check(abs(evaluate(W("merged")) - val) <= 1e-5, "the --merge export (a plain HF model) evaluates "
      "to the same loss")


# ckpt verify reads a LoRA checkpoint by its adapter table (the H200 smoke of
# 2026-12-02 found it checked the model's table and refused every LoRA run)
r = run([a.bin, "ckpt", "verify", W("ref")])
check("verify: OK" in r.stdout and "LoRA adapters" in r.stdout,
      "ckpt verify of a LoRA run: OK against its adapters")

# --lora-format peft: the checkpoint's adapters under PEFT's names, bit for bit
run([a.bin, "ckpt", "export", W("ref"), "--out", W("peft"), "--lora-format", "peft"])
pc = json.load(open(W("peft", "adapter_config.json")))
check(pc.get("peft_type") == "LORA" and pc.get("r") == 4 and pc.get("lora_alpha") == 16 and
      sorted(pc.get("target_modules", [])) == sorted(["q_proj", "k_proj", "v_proj", "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"]),
      f"adapter_config.json: LORA, r 4, alpha 16, the seven modules: {pc}")
st = {k: v for k, (dt, v) in read_st(W("peft", "adapter_model.safetensors")).items()
      if check(dt == "F32", f"{k}: F32 in an fp32 export") is None}
MOD = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
       "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
       "down": "mlp.down_proj"}
want = {}
for n in names:  # h.L.lora_T.A / .B
    layer, t, ab = n.split(".")[1], n.split(".")[2][5:], n.split(".")[3]
    want[f"base_model.model.model.layers.{layer}.{MOD[t]}.lora_{ab}.weight"] = ref_ad[n]
# base_model_name_or_path: what from_pretrained loads (AutoPeftModelForCausalLM),
# the Hugging Face directory --init-from's import came from, not the run folder
check(pc.get("base_model_name_or_path") == MODEL,
      f"base_model_name_or_path is the import's source {MODEL}: {pc.get('base_model_name_or_path')}")
check(sorted(st) == sorted(want), f"PEFT's tensor names, one per adapter: {sorted(st)[:2]}...")
check(all(st[k].shape == want[k].shape and np.array_equal(st[k], want[k]) for k in want),
      "every PEFT tensor equals the checkpoint's adapter bit for bit, shape [r, in] / [out, r]")
r = run([a.bin, "ckpt", "export", W("ref"), "--out", W("peft"), "--lora-format", "peft"],
        expect_rc=3)
check(os.path.exists(W("peft", "adapter_model.safetensors")),
      "a second --lora-format export onto the same --out is refused and the first stays")
# an --out whose parent folder is missing: exit 1 (an unwritable --out, README's
# table), one line naming the --out given and the fix, not a temporary name
for how in (["--lora-format", "peft"], ["--merge"]):
    out = W("no_such_dir", "sub", "x")
    r = run([a.bin, "ckpt", "export", W("ref"), "--out", out] + how, expect_rc=1)
    err = r.stderr.strip()
    check(f"--out {out}" in err and "mkdir -p " + W("no_such_dir", "sub") in err and
          ".tmp." not in err and len(err.splitlines()) == 1 and not os.path.exists(W("no_such_dir")),
          f"{how[0]} into a missing parent folder: exit 1 naming --out and the fix: {err}")
r = run([a.bin, "ckpt", "export", W("base"), "--out", W("nolora"), "--merge"], expect_rc=2)
check("not a LoRA run" in r.stderr, "--merge on a model that is not a LoRA run: exit 2")


def sample(src, *extra):
    """stdout as bytes: the greedy bytes of a barely trained model need not be UTF-8."""
    r = subprocess.run([a.bin, "sample", "--init", src, "--prompt", "And God", "--max-new", "12",
                        "--temperature", "0", "--device", "cpu"] + list(extra),
                       capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        sys.exit(f"FAIL: sample --init {src}: {r.stderr[-300:]!r}")
    return r.stdout


s1, s2 = sample(W("ref")), sample(W("merged"), "--tokenizer", "bytes")
check(len(s1) > 12 and s1 == s2, "sample of the LoRA run = sample of its --merge export")

# preemption and an exact resume, dropout on
lora_run("cut", 1, 1, spec, "--stop-after", 4)
check(max(losses(W("cut"))) == 4, "stopped after step 4")
r = lora_run("cut", 1, 1, spec)
check("at step 4" in r.stdout, "resumed at step 4")
got = losses(W("cut"))
check(all(got[s] == ref[s] for s in range(5, 9)), "steps 5-8 equal the uninterrupted run exactly")
_, cut_ad, _ = adapters(W("cut"))
check(all(np.array_equal(cut_ad[n], ref_ad[n]) for n in names),
      "final adapters equal the uninterrupted run bit for bit")

# ranks and ZeRO stages agree (dropout 0: masks are drawn per rank)
spec0 = "4,alpha=16," + ALL
one = losses(lora_run("r1", 1, 0, spec0) and W("r1"))
for np_, zero in ((2, 2), (4, 1)):
    got = losses(lora_run(f"r{np_}", np_, zero, spec0) and W(f"r{np_}"))
    worst = max(abs(got[s] - one[s]) for s in one)
    check(worst < 1e-5, f"{np_} ranks at ZeRO {zero} agree with 1 rank: max |dloss| {worst:.2e}")
lora_run("re", 2, 2, spec0, "--stop-after", 4)
lora_run("re", 1, 0, spec0)
got = losses(W("re"))
worst = max(abs(got[s] - one[s]) for s in range(5, 9))
check(worst < 1e-5, f"a 2-rank ZeRO 2 checkpoint resumes on 1 rank at ZeRO 0: {worst:.2e}")

# the base's identity: a moved copy resumes, another base is refused (exit 4)
lora_run("moved", 1, 1, spec0, "--stop-after", 4, "--steps", 8)
shutil.copytree(W("base"), W("base_moved"))
shutil.rmtree(W("base"))
r = lora_run("moved", 1, 1, spec0, "--steps", 6, base=W("base_moved"))
check("at step 4" in r.stdout, "a moved copy of the base (--init-from on resume) resumes")
shutil.copytree(W("base_moved"), W("base"))
train(a, 1, ["--init-from", W("base"), "--out", W("other")] + common[:-6] + ["--steps", 1])
r = lora_run("moved", 1, 1, spec0, "--steps", 8, base=W("other"), expect_rc=4)
check("--init-from" in r.stdout + r.stderr and "not the base" in r.stdout + r.stderr,
      "another base of the same shape: exit 4 naming --init-from")

# base_model_name_or_path of runs on other bases: a Hugging Face directory
# itself; a trained run (no Hugging Face name holds its weights): null
for out, base, want in (("on_hf", MODEL, MODEL), ("on_run", W("other"), None)):
    lora_run(out, 1, 1, spec0, "--steps", 1, base=base)
    run([a.bin, "ckpt", "export", W(out), "--out", W(out + "_peft"), "--lora-format", "peft"])
    got = json.load(open(W(out + "_peft", "adapter_config.json")))["base_model_name_or_path"]
    check(got == want, f"--init-from {base}: base_model_name_or_path {want}: {got}")

# the spec recorded and quoted is the targets that train, the family's
# default included (it was "targets=", empty, in the resume-mismatch line)
def error_line(r):
    return next((ln for ln in (r.stdout + r.stderr).splitlines() if "error: " in ln), "")


lora_run("dflt", 1, 1, "4", "--stop-after", 2)
_, _, dcfg = adapters(W("dflt"))
check(dcfg["lora"]["spec"] == "4,alpha=8,dropout=0,targets=q,v",
      f"a spec without targets= records the family's default: {dcfg['lora']['spec']}")
err = error_line(lora_run("dflt", 1, 1, "8", expect_rc=3))
check('--lora "8,alpha=8,dropout=0,targets=q,v" differs' in err and
      'written with --lora "4,alpha=8,dropout=0,targets=q,v"' in err,
      f"another --lora on resume: exit 3 quoting both specs with their targets: {err}")
r = lora_run("dflt", 1, 1, "4,targets=v,q", "--steps", 3)
check("at step 2" in r.stdout, "the default targets named on resume are the same spec")
# a checkpoint written before the spec was resolved ("targets=")
with h5py.File(W("dflt", "ckpt", "step_00000003", "index.h5"), "r+") as f:
    c = json.loads(f.attrs["config"])
    c["lora"]["spec"] = "4,alpha=8,dropout=0,targets="
    f.attrs["config"] = json.dumps(c)
err = error_line(lora_run("dflt", 1, 1, "4,targets=q,k", expect_rc=3))
check('written with --lora "4,alpha=8,dropout=0,targets=q,v"' in err,
      f"an older checkpoint's empty targets= is quoted as its family's default: {err}")
r = lora_run("dflt", 1, 1, "4,targets=q,v", "--steps", 4)
check("at step 3" in r.stdout, "and the same targets named resume it")

# usage errors (exit 2)
for bad, what in (("4,targets=qkv", "qkv"), ("0", "rank"), ("4,alpha=x", "alpha")):
    r = lora_run("bad", 1, 1, bad, expect_rc=2)
    check("--lora" in r.stdout + r.stderr, f"--lora {bad}: exit 2 naming --lora ({what})")
# targets= comes last (docs/lora.md): a key after it was taken as a key
err = error_line(lora_run("bad", 1, 1, "16,targets=q,v,alpha=32", expect_rc=2))
check("write --lora 16,alpha=32,targets=q,v" in err and not os.path.exists(W("bad")),
      f"--lora 16,targets=q,v,alpha=32: exit 2 saying how to write it: {err}")
# an unknown target: the list offered is this Llama model's (it offered qkv)
err = error_line(lora_run("bad", 1, 1, "4,targets=q,x", expect_rc=2))
check("--lora" in err and "'x'" in err and "q, k, v, o, gate, up, down" in err and
      "qkv" not in err, f"--lora 4,targets=q,x: exit 2 listing the Llama targets: {err}")
r = lora_run("bad", 1, 3, "4", expect_rc=2)
check("--zero 3" in r.stdout + r.stderr, "--lora with --zero 3: exit 2")
# --lora without --init-from trains on the seeded initialisation (tests/e2e/test_qlora.py)
print("PASS")
