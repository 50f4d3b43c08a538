"""QLoRA (train --lora ... --base-dtype nf4; docs/nf4.md), on the CPU: a
Llama-shaped model imported from tests/data/hf/llama-tiny is the base, its
projection weights held as NF4 only.

- 1 rank at ZeRO 0 and 2 ranks at ZeRO 2 agree within 1e-5 per step;
- the checkpoint's config records base_dtype nf4 and the digest of the base
  as loaded (before quantisation: the same as a bf16 LoRA run's); the loss
  differs from the bf16 LoRA run's (the base was quantised) but stays close;
- stop after step 4 and resume: steps 5-8 and the adapters bit for bit;
  resuming with --base-dtype bf16 is refused (exit 4);
- eval of the QLoRA run (its adapters merged into the dequantised NF4 base)
  equals the trainer's val loss;
- --lora without --init-from: the seeded --model initialisation is the base;
  a resume recreates it (digest checked: another --seed, exit 4 naming the
  seed that drew the base, not --init-from);
- --base-dtype nf4 without --lora: exit 2; plan --json counts the NF4 bytes.
"""
import json
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import check, losses, parse_args, run, train  # noqa: E402
from lora_setup import REPO, prepare  # noqa: E402

a = parse_args()
W, common = prepare(a)
SPEC = "4,alpha=16,targets=q,k,v,o,gate,up,down"


def qlora(out, np_, zero, *extra, expect_rc=0, dtype="nf4"):
    return train(a, np_, ["--init-from", W("base"), "--lora", SPEC, "--base-dtype", dtype,
                          "--out", W(out), "--zero", zero] + common + list(extra),
                 expect_rc=expect_rc)


def ckpt(run_dir):
    step = open(os.path.join(run_dir, "ckpt", "latest")).read().strip()
    with h5py.File(os.path.join(run_dir, "ckpt", step, "index.h5"), "r") as f:
        return {n: f["params"][n][...] for n in f["params"]}, json.loads(f.attrs["config"])


def fmt_bytes(n):
    """util/bytes.c's st_format_bytes."""
    v, u = float(n), 0
    while v >= 1024 and u < 4:
        v, u = v / 1024, u + 1
    unit = ["B", "KiB", "MiB", "GiB", "TiB"][u]
    return f"{n} B" if u == 0 else (f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}")


def plan_bytes(run_dir):
    return json.loads(open(os.path.join(run_dir, "metrics.jsonl")).readline())["memory_plan"]["bytes"]


r = qlora("q1", 1, 0)
one = losses(W("q1"))
# the banner says the base is NF4, with the plan's bytes (it said nothing)
pb = plan_bytes(W("q1"))
base_line = next((ln for ln in r.stdout.splitlines() if ln.startswith("  base ")), "")
check(base_line.startswith("  base       dtype nf4 (QLoRA, --base-dtype nf4)") and
      f"NF4, {fmt_bytes(pb['weights_nf4'])};" in base_line and
      f"in fp32, {fmt_bytes(pb['weights_base'])};" in base_line and
      f"scratch {fmt_bytes(pb['nf4_scratch'])}" in base_line,
      f"the configuration block says the base is NF4, with its bytes: {base_line!r}")
q1_ad, cfg = ckpt(W("q1"))
got = losses(qlora("q2", 2, 2) and W("q2"))
worst = max(abs(got[s] - one[s]) for s in one)
check(worst < 1e-5, f"2 ranks at ZeRO 2 agree with 1 rank under NF4: max |dloss| {worst:.2e}")
check(one[8] < one[1], f"the loss falls: {one[1]:.4f} -> {one[8]:.4f}")
lc = cfg.get("lora", {})
check(lc.get("base_dtype") == "nf4", f"the config records base_dtype nf4: {lc}")
r = qlora("b1", 1, 0, dtype="bf16")
bf = losses(W("b1"))
base_line = next((ln for ln in r.stdout.splitlines() if ln.startswith("  base ")), "")
check(base_line.startswith("  base       dtype fp32 (the working dtype") and
      fmt_bytes(plan_bytes(W("b1"))["weights_base"]) in base_line,
      f"a bf16-base run's banner names the working dtype: {base_line!r}")
_, bcfg = ckpt(W("b1"))
check(bcfg["lora"]["base_dtype"] == "bf16" and
      bcfg["lora"]["base_sha256"] == lc.get("base_sha256"),
      "the base digest is the loaded base's, before quantisation (= the bf16 LoRA run's)")
check(one[1] != bf[1] and abs(one[1] - bf[1]) < 0.05,
      f"step 1's loss moves by the quantisation only: nf4 {one[1]:.6f}, bf16 {bf[1]:.6f}")

# preemption and an exact resume; another base dtype refused
qlora("cut", 1, 0, "--stop-after", 4)
r = qlora("cut", 1, 0)
check("at step 4" in r.stdout, "resumed at step 4")
got = losses(W("cut"))
check(all(got[s] == one[s] for s in range(5, 9)), "steps 5-8 equal the uninterrupted run exactly")
cut_ad, _ = ckpt(W("cut"))
check(all(np.array_equal(cut_ad[n], q1_ad[n]) for n in q1_ad), "final adapters bit for bit")
qlora("cut2", 1, 0, "--stop-after", 4)
r = qlora("cut2", 1, 0, dtype="bf16", expect_rc=4)
check("--base-dtype" in r.stdout + r.stderr, "resume with --base-dtype bf16: exit 4 naming it")

# eval: the adapters merged into the dequantised NF4 base
val = [json.loads(line)["val_loss"] for line in open(W("q1", "metrics.jsonl"))
       if "val_loss" in json.loads(line)][-1]
r = run([a.bin, "eval", "--init", W("q1"), "--data", W("kjv.h5"), "--seq-len", "32",
         "--max-windows", "4", "--device", "cpu", "--json"])
ev = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
check(abs(ev - val) <= 1e-5, f"eval of the QLoRA run = the trainer's val loss: {ev:.6f} vs {val:.6f}")

# the PEFT export of a QLoRA run belongs on the NF4 base, not the bf16 one
# base_model_name_or_path names: the export's line and docs/lora.md say so
r = run([a.bin, "ckpt", "export", W("q1"), "--out", W("q1_peft"), "--lora-format", "peft"])
check("load them onto the NF4-quantised base, not its unquantised weights" in r.stdout,
      f"a QLoRA run's PEFT export says which base it belongs on: {r.stdout.strip()}")
r = run([a.bin, "ckpt", "export", W("b1"), "--out", W("b1_peft"), "--lora-format", "peft"])
check("NF4" not in r.stdout, "a bf16-base run's export says nothing of NF4")
doc = open(os.path.join(REPO, "docs", "lora.md")).read()
export = doc[doc.index("## Export"):doc.index("## Memory")]
check("QLoRA" in export and "dequantised NF4 base" in export and "--merge" in export,
      "docs/lora.md's Export section says a QLoRA export's base is the dequantised NF4 one")

# a fresh base: the seeded --model initialisation; resume recreates it
fresh = ["--model", "tiny", "--lora", "4", "--base-dtype", "nf4", "--data", W("kjv.h5"),
         "--seq-len", 32, "--micro-batch", 1, "--global-batch", 4, "--lr", 3e-3,
         "--log-every", 1, "--val-seqs", 4]
train(a, 1, fresh + ["--out", W("f_ref"), "--steps", 4])
# no --init-from: no name loads the base, base_model_name_or_path is null
run([a.bin, "ckpt", "export", W("f_ref"), "--out", W("f_peft"), "--lora-format", "peft"])
pc = json.load(open(W("f_peft", "adapter_config.json")))
check("base_model_name_or_path" in pc and pc["base_model_name_or_path"] is None,
      f"a fresh base's PEFT export: base_model_name_or_path null: {pc.get('base_model_name_or_path')!r}")
train(a, 1, fresh + ["--out", W("f_cut"), "--steps", 4, "--stop-after", 2])
r = train(a, 1, fresh + ["--out", W("f_cut"), "--steps", 4])
check("at step 2" in r.stdout, "a fresh-base QLoRA run resumes")
fr, fc = losses(W("f_ref")), losses(W("f_cut"))
check(all(fr[s] == fc[s] for s in (3, 4)), "its steps 3-4 equal the uninterrupted run")
train(a, 1, fresh + ["--out", W("f_seed"), "--steps", 4, "--stop-after", 2])
r = train(a, 1, fresh + ["--out", W("f_seed"), "--steps", 4, "--seed", 7], expect_rc=4)
err = next((ln for ln in (r.stdout + r.stderr).splitlines() if "error: " in ln), "")
# no --init-from was given: the message names the seeds, not --init-from
check(err.split("error: ")[-1].startswith("--seed 7:") and "drawn by --seed 1337" in err and
      "give --seed 1337" in err and "--init-from (none" not in err,
      f"a resume with another --seed (another base): exit 4 naming both seeds: {err}")

# usage and the plan
r = train(a, 1, ["--model", "tiny", "--base-dtype", "nf4", "--out", W("bad")] + common,
          expect_rc=2)
check("--lora" in r.stdout + r.stderr, "--base-dtype nf4 without --lora: exit 2")
r = run([a.bin, "plan", "--model", "tiny", "--lora", "4", "--base-dtype", "nf4", "--json"])
pb = json.loads(r.stdout)["bytes"]
r = run([a.bin, "plan", "--model", "tiny", "--lora", "4", "--json"])
bb = json.loads(r.stdout)["bytes"]
check(pb["weights_nf4"] > 0 and pb["nf4_scratch"] > 0 and bb["weights_nf4"] == 0 and
      pb["weights"] < bb["weights"], f"plan counts NF4: {pb['weights']} < {bb['weights']} bytes")
print("PASS")
