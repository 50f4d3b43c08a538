"""ckpt import / export: Hugging Face safetensors and llm.c model files.

- import tests/data/hf/tiny (and tiny-sharded) -> export hf fp32: every
  tensor's bytes equal the source's (numpy reads safetensors by its header);
- export hf bf16: every tensor is the fp32 one rounded to nearest even;
- HF -> import -> export llmc -> import the llm.c file -> export hf: bit-exact;
  a numpy reader of the llm.c file by llm.c's layout gives the HF weights;
  the bf16 llm.c file holds the fp32 weights rounded to nearest even;
- every malformed safetensors file and config.json gives its one error line
  and exit 3 (files made here, in the work directory; tests/data/hf is only
  read); the causal-mask buffers h.{l}.attn.bias are skipped, an lm_head
  equal to wte is accepted and a different one refused;
- an --out that exists is refused (import: holds checkpoints; export: any).
"""
import json
import os
import shutil

import numpy as np

from common import bf16_round, check, parse_args, read_dir, read_st, run, write_st

a = parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(HERE, "..", "data", "hf")
W = lambda n: os.path.join(a.work, n)
# ---- HF -> shardtrain -> HF, fp32: bit-identical -------------------------
src = read_dir(os.path.join(HF, "tiny"))
for name in ["tiny", "tiny-sharded"]:
    run([a.bin, "ckpt", "import", os.path.join(HF, name), "--out", W("run_" + name)])
    run([a.bin, "ckpt", "verify", W("run_" + name)])
    run([a.bin, "ckpt", "export", W("run_" + name), "--out", W("exp_" + name)])
    got = read_st(os.path.join(W("exp_" + name), "model.safetensors"))
    check(set(got) == set(src), f"{name}: export holds the source's tensor names ({len(got)})")
    bad = [k for k in src if got[k][0] != "F32" or got[k][1].shape != src[k][1].shape
           or got[k][1].tobytes() != src[k][1].tobytes()]
    check(not bad, f"{name}: fp32 import -> export is bit-identical for every tensor {bad[:3]}")
cfg = json.load(open(os.path.join(W("exp_tiny"), "config.json")))
check(cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
      and cfg["n_inner"] is None and cfg["tie_word_embeddings"] is True
      and (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["n_positions"], cfg["vocab_size"])
      == (2, 4, 64, 64, 1000), "exported config.json: GPT2LMHeadModel, shape, n_inner null, tied")
ck = run([a.bin, "ckpt", "info", W("run_tiny")]).stdout
check('"imported_from":{"source":' in ck, "the checkpoint's config says where it was imported from")

# bf16 export = fp32 rounded to nearest even
run([a.bin, "ckpt", "export", W("run_tiny"), "--out", W("exp_bf16"), "--dtype", "bf16"])
got = read_st(os.path.join(W("exp_bf16"), "model.safetensors"))
bad = [k for k in src if got[k][0] != "BF16" or not np.array_equal(got[k][1], bf16_round(src[k][1]))]
check(not bad, f"bf16 export: every tensor is the fp32 one rounded to nearest even {bad[:3]}")
# the bf16 export imports again, to the same values as the bf16 fixture rounds to
run([a.bin, "ckpt", "import", W("exp_bf16"), "--out", W("run_bf16")])

# ---- llm.c -----------------------------------------------------------------
run([a.bin, "ckpt", "export", W("run_tiny"), "--out", W("tiny.llmc"), "--format", "llmc"])
raw = open(W("tiny.llmc"), "rb").read()
h = np.frombuffer(raw[:1024], dtype=np.int32)
check(list(h[:8]) == [20240326, 3, 64, 1000, 2, 4, 64, 1024],
      "llm.c header: magic, version 3, maxT, V, L, NH, C, Vp")
L, C, V, Vp, T = 2, 64, 1000, 1024, 64
sizes = [("wte", Vp * C), ("wpe", T * C), ("ln1w", L * C), ("ln1b", L * C),
         ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C), ("attprojw", L * C * C),
         ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C), ("fcw", L * 4 * C * C),
         ("fcb", L * 4 * C), ("fcprojw", L * C * 4 * C), ("fcprojb", L * C), ("lnfw", C),
         ("lnfb", C)]
check(len(raw) == 1024 + 4 * sum(n for _, n in sizes), "llm.c file size = header + parameters")
flat, off, p = np.frombuffer(raw[1024:], dtype=np.float32), 0, {}
for k, n in sizes:
    p[k] = flat[off:off + n]
    off += n
S = lambda k: src["transformer." + k][1]
ok = np.array_equal(p["wte"].reshape(Vp, C)[:V], S("wte.weight")) and \
    not p["wte"].reshape(Vp, C)[V:].any() and np.array_equal(p["wpe"].reshape(T, C), S("wpe.weight"))
for l in range(L):
    H = lambda k: S(f"h.{l}.{k}")
    ok &= np.array_equal(p["qkvw"].reshape(L, 3 * C, C)[l], H("attn.c_attn.weight").T)
    ok &= np.array_equal(p["qkvb"].reshape(L, 3 * C)[l], H("attn.c_attn.bias"))
    ok &= np.array_equal(p["attprojw"].reshape(L, C, C)[l], H("attn.c_proj.weight").T)
    ok &= np.array_equal(p["fcw"].reshape(L, 4 * C, C)[l], H("mlp.c_fc.weight").T)
    ok &= np.array_equal(p["fcprojw"].reshape(L, C, 4 * C)[l], H("mlp.c_proj.weight").T)
    ok &= np.array_equal(p["fcprojb"].reshape(L, C)[l], H("mlp.c_proj.bias"))
    ok &= np.array_equal(p["ln2w"].reshape(L, C)[l], H("ln_2.weight"))
    ok &= np.array_equal(p["ln1b"].reshape(L, C)[l], H("ln_1.bias"))
ok &= np.array_equal(p["lnfw"], S("ln_f.weight")) and np.array_equal(p["lnfb"], S("ln_f.bias"))
check(ok, "numpy reader of the llm.c file (llm.c's layout) gives the HF weights, transposed")
run([a.bin, "ckpt", "import", W("tiny.llmc"), "--out", W("run_llmc")])
run([a.bin, "ckpt", "export", W("run_llmc"), "--out", W("exp_llmc")])
got = read_st(os.path.join(W("exp_llmc"), "model.safetensors"))
check(all(got[k][1].tobytes() == src[k][1].tobytes() for k in src),
      "HF -> import -> llm.c -> import -> HF is bit-exact in fp32")
run([a.bin, "ckpt", "export", W("run_tiny"), "--out", W("tiny_bf16.llmc"), "--format", "llmc",
     "--dtype", "bf16"])
rb = open(W("tiny_bf16.llmc"), "rb").read()
check(np.frombuffer(rb[:1024], dtype=np.int32)[1] == 5 and
      np.array_equal(np.frombuffer(rb[1024:], dtype=np.uint16), bf16_round(flat)),
      "bf16 llm.c file (version 5) = the fp32 file rounded to nearest even")
r = run([a.bin, "ckpt", "export", W("run_tiny"), "--out", W("tiny.llmc"), "--format", "llmc"],
        expect_rc=3)
check("already exists" in r.stderr, "export refuses an existing --out (exit 3)")
r = run([a.bin, "ckpt", "import", os.path.join(HF, "tiny"), "--out", W("run_tiny")], expect_rc=3)
check("already holds checkpoints" in r.stderr, "import refuses an --out holding checkpoints")

# ---- malformed inputs: one error line, exit 3 --------------------------------
tiny_cfg = json.load(open(os.path.join(HF, "tiny", "config.json")))
n_case = [0]


def case(what, tensors=None, expect=None, cfg_edit=None, ok=False, **kw):
    n_case[0] += 1
    d = W(f"bad{n_case[0]}")
    os.makedirs(d)
    c = dict(tiny_cfg)
    if cfg_edit:
        cfg_edit(c)
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    if tensors is not None:
        write_st(os.path.join(d, "model.safetensors"), tensors, **kw)
    r = run([a.bin, "ckpt", "import", d, "--out", d + "_run"], expect_rc=0 if ok else 3)
    if ok:
        check(True, what)
        return r
    err = [l for l in r.stderr.splitlines() if l.strip()]
    check(len(err) == 1 and all(e in err[0] for e in expect),
          f"{what}: exit 3, one line with {expect}: {err[-1] if err else ''}")
    return r


T0 = dict(src)
BT = lambda k: W(f"bad{n_case[0] + 1}") + "/model.safetensors"


def with_(**extra):
    t = dict(T0)
    t.update(extra)
    return t


case("header length past the file", T0, [BT(0), "header length", "past the end"], length=10 ** 9)
case("header not JSON", T0, ["not a JSON object"], raw_header=b"{not json")
case("begin > end", T0, ["transformer.wpe.weight", "begin", "> end"],
     header_edit=lambda h: h["transformer.wpe.weight"].update(data_offsets=[500, 400]))
case("an offset past the file", T0, ["transformer.wpe.weight", "past the end of the file"],
     header_edit=lambda h: h["transformer.wpe.weight"].update(data_offsets=[0, 10 ** 8]))
case("size does not match dtype x shape", T0, ["transformer.ln_f.bias", "bytes of data",
                                               "dtype F32 x shape needs"],
     header_edit=lambda h: h["transformer.ln_f.bias"].update(shape=[65]))
case("unknown dtype", T0, ["transformer.ln_f.bias", "dtype F64 is not supported"],
     header_edit=lambda h: h["transformer.ln_f.bias"].update(dtype="F64"))
# a duplicate key: cJSON keeps both, the reader must refuse
dup = json.dumps({"transformer.ln_f.bias": {"dtype": "F32", "shape": [64],
                                            "data_offsets": [0, 256]}})
case("duplicate name", {"transformer.ln_f.bias": ("F32", np.zeros(64, np.float32))},
     ["transformer.ln_f.bias", "appears twice"],
     raw_header=("{" + dup[1:-1] + "," + dup[1:-1] + "}").encode())
t = dict(T0)
del t["transformer.h.1.mlp.c_fc.bias"]
case("a missing tensor", t, ["transformer.h.1.mlp.c_fc.bias", "is missing"])
case("an extra tensor", with_(**{"transformer.h.0.attn.rotary": ("F32", np.zeros(4, np.float32))}),
     ["transformer.h.0.attn.rotary", "not part of a GPT-2 model"])
case("config.json's shape disagrees with a tensor", T0,
     ["transformer.wpe.weight", "[64, 64]", "[128, 64]"], cfg_edit=lambda c: c.update(n_positions=128))
case("n_inner other than 4 x n_embd", T0, ["n_inner 128 is not supported"],
     cfg_edit=lambda c: c.update(n_inner=128))
case("n_inner 4 x n_embd is accepted", T0, ok=True, cfg_edit=lambda c: c.update(n_inner=256))
case("activation_function relu refused", T0, ["activation_function relu"],
     cfg_edit=lambda c: c.update(activation_function="relu"))
case("scale_attn_by_inverse_layer_idx refused", T0, ["scale_attn_by_inverse_layer_idx"],
     cfg_edit=lambda c: c.update(scale_attn_by_inverse_layer_idx=True))
case("unknown model_type", T0, ["model_type \"mistral\" is not supported yet"],
     cfg_edit=lambda c: c.update(model_type="mistral"))
mask = np.tril(np.ones((64, 64), np.float32)).reshape(1, 1, 64, 64)
buf = {f"transformer.h.{l}.attn.bias": ("F32", mask) for l in range(2)}
buf["transformer.h.0.attn.masked_bias"] = ("F32", np.array(-1e4, np.float32))
case("the causal-mask buffers h.{l}.attn.bias and attn.masked_bias are skipped", with_(**buf),
     ok=True)
run([a.bin, "ckpt", "export", W(f"bad{n_case[0]}_run"), "--out", W("exp_mask")])
got = read_st(os.path.join(W("exp_mask"), "model.safetensors"))
check(all(got[k][1].tobytes() == src[k][1].tobytes() for k in src) and set(got) == set(src),
      "... and the weights import unchanged (the buffers are not exported)")
case("lm_head.weight equal to wte is accepted (tied)",
     with_(**{"lm_head.weight": src["transformer.wte.weight"]}), ok=True)
other = src["transformer.wte.weight"][1].copy()
other[3, 5] += 1
case("a different lm_head.weight is refused",
     with_(**{"lm_head.weight": ("F32", other)}), ["lm_head.weight", "untied output head"])
# without the "transformer." prefix, as openai-community/gpt2's own file
case("names without the transformer. prefix", {k.replace("transformer.", ""): v
                                               for k, v in T0.items()}, ok=True)

# sharded: a tensor mapped to a missing file
d = W("shard_missing")
shutil.copytree(os.path.join(HF, "tiny-sharded"), d)
os.remove(os.path.join(d, "model-00003-of-00004.safetensors"))
r = run([a.bin, "ckpt", "import", d, "--out", d + "_run"], expect_rc=3)
check("model-00003-of-00004.safetensors" in r.stderr and "does not exist" in r.stderr
      and "is mapped to" in r.stderr, "sharded: a tensor mapped to a missing file names both: "
      + r.stderr.strip())
# tokenizer files travel: source dir -> RUN/tokenizer -> export
d = W("with_tok")
shutil.copytree(os.path.join(HF, "tiny"), d)
tok = {"vocab.json": '{"a": 0}', "merges.txt": "#version: 0.2\n", "tokenizer_config.json": "{}"}
for k, v in tok.items():
    open(os.path.join(d, k), "w").write(v)
run([a.bin, "ckpt", "import", d, "--out", W("run_tok")])
run([a.bin, "ckpt", "export", W("run_tok"), "--out", W("exp_tok")])
check(all(open(os.path.join(W("run_tok"), "tokenizer", k)).read() == v and
          open(os.path.join(W("exp_tok"), k)).read() == v for k, v in tok.items()),
      "the source's tokenizer files are copied to RUN/tokenizer/ and travel with the export")

# an llm.c file padded to another multiple (Vp 1100): its first V rows are read
hdr = np.frombuffer(raw[:1024], dtype=np.int32).copy()
hdr[7] = 1100
wte = np.zeros((1100, C), np.float32)
wte[:V] = p["wte"].reshape(Vp, C)[:V]
open(W("vp1100.llmc"), "wb").write(hdr.tobytes() + wte.tobytes() + raw[1024 + 4 * Vp * C:])
run([a.bin, "ckpt", "import", W("vp1100.llmc"), "--out", W("run_vp")])
run([a.bin, "ckpt", "export", W("run_vp"), "--out", W("exp_vp")])
got = read_st(os.path.join(W("exp_vp"), "model.safetensors"))
check(all(got[k][1].tobytes() == src[k][1].tobytes() for k in src),
      "an llm.c file with padded_vocab_size 1100 imports to the same weights")
open(W("short.llmc"), "wb").write(raw[:-4])
r = run([a.bin, "ckpt", "import", W("short.llmc"), "--out", W("run_short")], expect_rc=3)
check("truncated" in r.stderr, "a truncated llm.c file: exit 3 (" + r.stderr.strip() + ")")
print("all ckpt import/export checks passed")
