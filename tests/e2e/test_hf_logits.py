"""Logits of imported Hugging Face GPT-2 models equal transformers' (CPU, fp32).

tests/data/hf/oracle holds what transformers computed (on the GPU machine,
in fp32) for tiny/ and tiny-bf16/ on a fixed [2, 16] batch. shardtrain's
CPU forward (tests/hf_logits.c, st_model on the CPU ops table) of
  tiny, tiny-sharded (vs logits_fp32.f32)  max abs diff <= 1e-4
  tiny-bf16 (vs logits_bf16.f32: the same bf16 weights, computed in fp32) <= 1e-4
  tiny-fp16 (vs logits_fp32.f32: fp16-rounded weights; no fp16 oracle) <= 1e-2
and of the model imported into a run directory, and exported back and
imported again (the checkpoint path), the same as the direct read.
Run with --driver PATH/hf_logits (ctest passes it).
"""
import argparse
import json
import os
import shutil

import numpy as np

from common import check, run

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--driver", required=True)
p.add_argument("--work", required=True)
a = p.parse_args()
shutil.rmtree(a.work, ignore_errors=True)
os.makedirs(a.work)
drv = a.driver
HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf")
W = lambda n: os.path.join(a.work, n)
o = json.load(open(os.path.join(HF, "oracle", "oracle.json")))
B, T, V = o["logits_shape"]
ids = np.array(o["inputs"], dtype=np.int32)
ids.tofile(W("ids.i32"))
ref = {k: np.fromfile(os.path.join(HF, "oracle", f"logits_{k}.f32"), dtype="<f4").reshape(B, T, V)
       for k in ("fp32", "bf16")}


def logits(src, tag):
    out = W(tag + ".f32")
    run([drv, src, W("ids.i32"), str(B), str(T), out])
    return np.fromfile(out, dtype="<f4").reshape(B, T, V)


cases = [("tiny", "fp32", 1e-4), ("tiny-sharded", "fp32", 1e-4), ("tiny-bf16", "bf16", 1e-4),
         ("tiny-fp16", "fp32", 1e-2)]
got = {}
for name, oracle, tol in cases:
    got[name] = logits(os.path.join(HF, name), name)
    d = float(np.abs(got[name] - ref[oracle]).max())
    print(f"{name}: max abs diff vs transformers ({oracle} oracle) = {d:.3g} (tolerance {tol})")
    check(d <= tol, f"{name}: logits equal transformers' within {tol} (max abs diff {d:.3g})")
# fp16 weights: tighter against the fp32 oracle than a wrong mapping could be
check(np.abs(got["tiny-fp16"] - ref["fp32"]).max() < 0.1 * np.abs(ref["fp32"]).max(),
      "tiny-fp16 is close to the fp32 model (rounding only)")
run([a.bin, "ckpt", "import", os.path.join(HF, "tiny"), "--out", W("run")])
check(np.array_equal(logits(W("run"), "run"), got["tiny"]),
      "the imported run directory gives the same logits as the HF directory, bit for bit")
run([a.bin, "ckpt", "export", W("run"), "--out", W("tiny.llmc"), "--format", "llmc"])
check(np.array_equal(logits(W("tiny.llmc"), "llmc"), got["tiny"]),
      "its llm.c export gives the same logits, bit for bit")
