"""Logits of imported Llama-family models equal HF's formulas (CPU, fp32).

The numpy models of hf_family.py (llama-gqa: GQA 4/2 with llama3 scaling in
its interpolated band, untied; qwen2-mqa: MQA with q/k/v biases, tied;
llama-bias: every bias, tied) run through shardtrain's CPU forward
(tests/hf_logits.c on the Hugging Face directory) and through
hf_family.reference_logits, transformers' Llama/Qwen2 forward written in
float64 numpy: max |diff| <= 1e-4, the bound e2e_hf_logits holds GPT-2 to.
The same logits, bit for bit, from the run directory `ckpt import` wrote
and from its `ckpt export`. When the transformers-made fixtures are
committed (tests/fixtures/make_hf_llama.py), the numpy reference is itself
checked against transformers' float64 logits in golden/*.h5 (<= 1e-6).
"""
import argparse
import os
import shutil

import numpy as np

from common import check, run
from hf_family import llama_config, make, qwen2_config, reference_logits, tensors

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--driver", required=True)
p.add_argument("--work", required=True)
a = p.parse_args()
shutil.rmtree(a.work, ignore_errors=True)
os.makedirs(a.work)
W = lambda n: os.path.join(a.work, n)
HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf")
B, T = 2, 16


def logits(src, ids, V, tag):
    ids.astype(np.int32).tofile(W(tag + ".i32"))
    run([a.driver, src, W(tag + ".i32"), str(B), str(T), W(tag + ".f32")])
    return np.fromfile(W(tag + ".f32"), dtype="<f4").reshape(B, T, V)


bc = llama_config(attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                  rope_scaling=None, num_key_value_heads=4)
models = {"llama-gqa": (llama_config(), 1), "qwen2-mqa": (qwen2_config(), 2),
          "llama-bias": (bc, 3)}
for name, (c, seed) in models.items():
    t = tensors(c, seed)
    d = make(W(name), c, t)
    V = c["vocab_size"]
    ids = np.random.default_rng(seed + 10).integers(0, V, size=(B, T))
    ref = reference_logits(c, t, ids)
    got = logits(d, ids, V, name)
    diff = float(np.abs(got - ref).max())
    check(diff <= 1e-4, f"{name}: CPU logits equal HF's formulas within 1e-4 (max |diff| "
                        f"{diff:.3g}, logits up to {np.abs(ref).max():.3g})")
    run([a.bin, "ckpt", "import", d, "--out", W(name + "_run")])
    run([a.bin, "ckpt", "export", W(name + "_run"), "--out", W(name + "_exp")])
    check(np.array_equal(logits(W(name + "_run"), ids, V, name + "_run"), got) and
          np.array_equal(logits(W(name + "_exp"), ids, V, name + "_exp"), got),
          f"{name}: the imported run directory and its export give the same logits, bit for bit")

try:
    import h5py
except ImportError:
    h5py = None
for name in ["llama-tiny", "qwen2-tiny", "smollm-tiny"]:
    h5 = os.path.join(HF, "golden", name + ".h5")
    if h5py is None or not os.path.exists(h5):
        print(f"SKIP part: {h5} (or h5py) not there; the reference is checked against "
              "transformers when the fixtures are committed")
        continue
    import json
    from common import read_dir
    c = json.load(open(os.path.join(HF, name, "config.json")))
    with h5py.File(h5, "r") as f:
        ids, want = f["tokens"][()], f["logits"][()]
    diff = float(np.abs(reference_logits(c, read_dir(os.path.join(HF, name)), ids) - want).max())
    check(diff <= 1e-6, f"{name}: the numpy reference equals transformers' float64 logits "
                        f"(max |diff| {diff:.3g})")
print("all Llama-family logits checks passed")
