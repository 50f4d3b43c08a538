"""ckpt import / export of Hugging Face LlamaForCausalLM and Qwen2ForCausalLM
directories.

Models are made here with numpy (fixed seed, every tensor random) and
config.json files written as transformers 4 writes them (rope_theta,
rope_scaling) and as transformers 5 does (rope_parameters):
  llama-gqa   4 heads, 2 KV heads, llama3 rope scaling, untied head, eos a list
  qwen2-mqa   4 heads, 1 KV head, q/k/v biases, tied head (no lm_head tensor),
              transformers 5 style
  llama-bias  attention_bias and mlp_bias true, tied, no scaling
and, when tests/data/hf holds them, the transformers-made fixtures of
tests/fixtures/make_hf_llama.py (llama-tiny, llama-tiny-sharded, qwen2-tiny,
smollm-tiny). For each:
- import -> export fp32: the source's tensor names, every tensor's bytes equal;
  export -> import -> export: the same bytes again; config.json keeps the
  shape, KV heads, FFN width, epsilon, RoPE theta and scaling, tie, biases and
  the bos/eos/pad ids of the source;
- a sharded copy imports to the same weights; bf16 export is the fp32 one
  rounded to nearest even, and a bf16 source imports to its values;
- what the model description cannot express is refused with one line naming
  the file and field, exit 3: rope_scaling / rope_parameters type "yarn",
  use_sliding_window true, a sliding layer in layer_types, hidden_act gelu,
  head_dim other than hidden/heads, partial_rotary_factor, llama3 scaling
  without original_max_position_embeddings, KV heads not dividing the heads;
  and broken tensor sets name the tensor: an untied config without
  lm_head.weight, a missing k_proj, a k_proj of the wrong shape, an extra
  tensor, a tied config whose lm_head differs from the embedding (one equal
  to it is accepted); llm.c export of a Llama model is refused.
"""
import json
import os
import shutil

import numpy as np

from common import bf16_round, check, parse_args, read_dir, run
from hf_family import llama_config, make as make_dir, qwen2_config, tensors

a = parse_args()
HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf")
W = lambda n: os.path.join(a.work, n)
make = lambda name, c, t, shards=1: make_dir(W(name), c, t, shards)


def rope_of(c):
    """(theta, scaling or None) from either transformers version's fields."""
    rp = c.get("rope_parameters")
    if rp:
        sc = {k: v for k, v in rp.items() if k != "rope_theta"}
        theta = rp.get("rope_theta", 10000.0)
    else:
        sc, theta = c.get("rope_scaling"), c.get("rope_theta", 10000.0)
    if sc:
        sc = dict(sc)
        sc["rope_type"] = sc.pop("type", sc.get("rope_type"))
        if sc["rope_type"] == "default":
            sc = None
    return theta, sc


FIELDS = ["model_type", "architectures", "hidden_size", "intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "max_position_embeddings", "rms_norm_eps", "vocab_size", "tie_word_embeddings",
          "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id"]


def same_config(src, got, what):
    bad = [k for k in FIELDS if k in src and src[k] != got.get(k)]
    if src.get("num_key_value_heads") is None:
        bad = [k for k in bad if k != "num_key_value_heads"]
    if src["model_type"] == "llama":
        bad += [k for k in ("attention_bias", "mlp_bias") if src.get(k, False) != got.get(k)]
    if rope_of(src) != rope_of(got):
        bad.append(f"rope {rope_of(src)} != {rope_of(got)}")
    check(not bad, f"{what}: exported config.json keeps {', '.join(FIELDS[:4])}... "
                   f"(differing: {bad})")
    check(got.get("torch_dtype") == got.get("dtype") and got["dtype"] in ("float32", "bfloat16"),
          f"{what}: torch_dtype and dtype written ({got.get('dtype')})")


def round_trip(name, src_dir):
    src = read_dir(src_dir)
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    r = run([a.bin, "ckpt", "import", src_dir, "--out", W("run_" + name)])
    print(r.stdout.strip())
    run([a.bin, "ckpt", "verify", W("run_" + name)])
    run([a.bin, "ckpt", "export", W("run_" + name), "--out", W("exp_" + name)])
    got = read_dir(W("exp_" + name))
    want = {k: v for k, v in src.items() if cfg.get("tie_word_embeddings") is not True
            or k != "lm_head.weight"}
    check(set(got) == set(want), f"{name}: export holds the source's {len(want)} tensor names "
                                 f"(extra {sorted(set(got) - set(want))[:3]}, missing "
                                 f"{sorted(set(want) - set(got))[:3]})")
    bad = [k for k in want if got[k][0] != "F32" or got[k][1].shape != want[k][1].shape
           or (want[k][0] == "F32" and got[k][1].tobytes() != want[k][1].tobytes())]
    check(not bad, f"{name}: import -> export fp32 gives every tensor its shape and bytes {bad[:3]}")
    ecfg = json.load(open(os.path.join(W("exp_" + name), "config.json")))
    same_config(cfg, ecfg, name)
    run([a.bin, "ckpt", "import", W("exp_" + name), "--out", W("run2_" + name)])
    run([a.bin, "ckpt", "export", W("run2_" + name), "--out", W("exp2_" + name)])
    again = read_dir(W("exp2_" + name))
    check(set(again) == set(got) and all(again[k][1].tobytes() == got[k][1].tobytes() for k in got)
          and json.load(open(os.path.join(W("exp2_" + name), "config.json"))) == ecfg,
          f"{name}: export -> import -> export is bit-identical, config.json too")
    return got


# ---- round trips -------------------------------------------------------------
lc, qc = llama_config(), qwen2_config()
bc = llama_config(attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                  rope_scaling=None, num_key_value_heads=4, pad_token_id=0)
lt, qt, bt = tensors(lc, 1), tensors(qc, 2), tensors(bc, 3)
models = {"llama-gqa": (lc, lt), "qwen2-mqa": (qc, qt), "llama-bias": (bc, bt)}
exported = {}
for name, (c, t) in models.items():
    exported[name] = round_trip(name, make(name, c, t))
ck = run([a.bin, "ckpt", "info", W("run_llama-gqa")]).stdout
check('"hf_special_ids":{"bos_token_id":1,"eos_token_id":[2,3]}' in ck,
      "the checkpoint keeps the source's bos/eos ids (its config's hf_special_ids)")

# sharded: the same weights as the single file
d = make("llama-gqa-sharded", lc, lt, shards=3)
run([a.bin, "ckpt", "import", d, "--out", W("run_sharded")])
run([a.bin, "ckpt", "export", W("run_sharded"), "--out", W("exp_sharded")])
got = read_dir(W("exp_sharded"))
check(all(got[k][1].tobytes() == exported["llama-gqa"][k][1].tobytes() for k in lt),
      "a 3-shard copy (model.safetensors.index.json) imports to the same weights")

# bf16 export = fp32 rounded to nearest even; a bf16 source imports to its values
run([a.bin, "ckpt", "export", W("run_qwen2-mqa"), "--out", W("exp_q_bf16"), "--dtype", "bf16"])
got = read_dir(W("exp_q_bf16"))
check(all(got[k][0] == "BF16" and np.array_equal(got[k][1], bf16_round(qt[k][1])) for k in qt),
      "bf16 export: every tensor is the fp32 one rounded to nearest even")
check(json.load(open(os.path.join(W("exp_q_bf16"), "config.json")))["dtype"] == "bfloat16",
      "bf16 export's config.json says bfloat16")
run([a.bin, "ckpt", "import", W("exp_q_bf16"), "--out", W("run_q_bf16")])
run([a.bin, "ckpt", "export", W("run_q_bf16"), "--out", W("exp_q_bf16_f32")])
got = read_dir(W("exp_q_bf16_f32"))
widen = lambda b: (b.astype(np.uint32) << 16).view(np.float32)
check(all(np.array_equal(got[k][1], widen(bf16_round(qt[k][1]))) for k in qt),
      "a bf16 source imports to its bf16 values exactly (exported back as fp32)")

# the transformers-made fixtures, when committed
for name in ["llama-tiny", "llama-tiny-sharded", "qwen2-tiny", "smollm-tiny"]:
    if os.path.exists(os.path.join(HF, name, "config.json")):
        round_trip(name, os.path.join(HF, name))
    else:
        print(f"SKIP part: {HF}/{name} not made yet (tests/fixtures/make_hf_llama.py)")

# ---- refusals: one line naming the file and field, exit 3 --------------------
n_case = [0]


def case(what, c, t, expect, rc=3):
    n_case[0] += 1
    d = make(f"bad{n_case[0]}", c, t)
    r = run([a.bin, "ckpt", "import", d, "--out", d + "_run"], expect_rc=rc)
    if rc == 0:
        check(True, what)
        return
    err = [l for l in r.stderr.splitlines() if l.strip()]
    check(len(err) == 1 and all(e in err[0] for e in expect),
          f"{what}: exit 3, one line with {expect}: {err[-1] if err else ''}")


CJ = lambda n: W(f"bad{n_case[0] + 1}") + "/config.json"
yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
case("rope_scaling yarn", llama_config(rope_scaling=yarn), lt,
     [CJ(0), "rope_scaling", "rope_type \"yarn\" is not supported"])
case("rope_parameters yarn (transformers 5)",
     qwen2_config(rope_parameters=dict(yarn, rope_theta=1e6)), qt,
     [CJ(0), "rope_parameters", "\"yarn\""])
case("rope_scaling linear (legacy 'type' key)",
     llama_config(rope_scaling={"type": "linear", "factor": 2.0}), lt, [CJ(0), "\"linear\""])
case("use_sliding_window true", qwen2_config(use_sliding_window=True, sliding_window=16), qt,
     [CJ(0), "use_sliding_window true is not supported"])
case("a sliding layer in layer_types",
     qwen2_config(layer_types=["full_attention", "sliding_attention"]), qt,
     [CJ(0), "layer_types", "sliding_attention"])
case("hidden_act gelu", llama_config(hidden_act="gelu"), lt,
     [CJ(0), "hidden_act gelu is not supported"])
case("head_dim other than hidden/heads", llama_config(head_dim=16), lt,
     [CJ(0), "head_dim 16 is not supported"])
case("partial_rotary_factor", llama_config(partial_rotary_factor=0.5), lt,
     [CJ(0), "partial_rotary_factor 0.5"])
sc = dict(lc["rope_scaling"])
del sc["original_max_position_embeddings"]
case("llama3 scaling without original_max_position_embeddings", llama_config(rope_scaling=sc),
     lt, [CJ(0), "original_max_position_embeddings"])
case("KV heads not dividing the heads", llama_config(num_key_value_heads=3), lt,
     [CJ(0), "num_key_value_heads 3 must divide num_attention_heads 4"])
case("a missing shape field", {k: v for k, v in lc.items() if k != "intermediate_size"}, lt,
     [CJ(0), "intermediate_size must be a positive integer"])
t = dict(lt)
del t["lm_head.weight"]
case("untied config without lm_head.weight", lc, t,
     ["lm_head.weight is missing", "tie_word_embeddings is false"])
t = dict(lt)
del t["model.layers.1.self_attn.k_proj.weight"]
case("a missing k_proj", lc, t, ["model.layers.1.self_attn.k_proj.weight is missing"])
t = dict(lt)
t["model.layers.0.self_attn.k_proj.weight"] = ("F32", np.zeros((32, 32), np.float32))
case("k_proj with the heads' rows, not the KV heads'", lc, t,
     ["model.layers.0.self_attn.k_proj.weight", "[32, 32]", "[16, 32]"])
t = dict(lt)
t["model.layers.0.self_attn.k_norm.weight"] = ("F32", np.ones(8, np.float32))
case("an extra tensor", lc, t, ["model.layers.0.self_attn.k_norm.weight", "not part of a Llama"])
t = dict(qt)
t["lm_head.weight"] = qt["model.embed_tokens.weight"]
case("tied config with an lm_head equal to the embedding", qc, t, [], rc=0)
other = qt["model.embed_tokens.weight"][1].copy()
other[0, 0] += 1
t["lm_head.weight"] = ("F32", other)
case("tied config with a different lm_head", qc, t,
     ["lm_head.weight differs from model.embed_tokens.weight", "tie_word_embeddings"])
t = dict(lt)
for l in range(2):
    t[f"model.layers.{l}.self_attn.rotary_emb.inv_freq"] = ("F32", np.ones(4, np.float32))
case("rotary_emb.inv_freq buffers are skipped", lc, t, [], rc=0)
r = run([a.bin, "ckpt", "export", W("run_llama-gqa"), "--out", W("x.llmc"), "--format", "llmc"],
        expect_rc=3)
check("--format llmc writes GPT-2 only" in r.stderr and not os.path.exists(W("x.llmc")),
      "llm.c export of a llama model is refused: " + r.stderr.strip())
print("all Llama-family import/export checks passed")
