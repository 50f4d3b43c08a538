"""Small Llama-family models made with numpy for the e2e tests, and HF's
Llama/Qwen2 forward in float64 numpy as an oracle that needs no torch.

The forward follows transformers' modeling_llama.py / modeling_qwen2.py
(eager attention): RMSNorm x * rsqrt(mean(x^2) + eps) * w; rotate-half RoPE
with inv_freq = theta^(-2i/HD) computed in fp32 as transformers does,
Llama 3 scaling by _compute_llama3_parameters (modeling_rope_utils.py); GQA
by repeat_kv (query head h reads KV head h // (NH / NKV)); causal softmax of
q k^T / sqrt(HD); SwiGLU down(silu(gate(x)) * up(x)); the head lm_head or,
tied, embed_tokens. transformers' own numbers are the golden test's
(test_hf_llama_golden.c); this one is for the synthetic models.
"""
import json
import os

import numpy as np

from common import write_st


def llama_config(**kw):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
         "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
         # original 256: the wavelength 167 of HD 8 lies in the band llama3 interpolates
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
         "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
         "attention_dropout": 0.0, "vocab_size": 200, "bos_token_id": 1,
         "eos_token_id": [2, 3], "torch_dtype": "float32", "transformers_version": "4.46.0"}
    c.update(kw)
    return c


def qwen2_config(**kw):
    c = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 24,
         "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 1, "hidden_act": "silu", "max_position_embeddings": 48,
         "rms_norm_eps": 1e-06,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
         "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": None,
         "max_window_layers": 2, "layer_types": ["full_attention", "full_attention"],
         "attention_dropout": 0.0, "vocab_size": 130, "bos_token_id": None,
         "eos_token_id": 129, "dtype": "float32", "transformers_version": "5.17.0"}
    c.update(kw)
    return c


def tensors(c, seed):
    """HF name -> ("F32", array) for config c, every value random."""
    g = np.random.default_rng(seed)
    C, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    NH = c["num_attention_heads"]
    HD, NKV = C // NH, c.get("num_key_value_heads", NH)
    qwen = c["model_type"] == "qwen2"
    attn_b = qwen or c.get("attention_bias", False)
    r = lambda *s: ("F32", (0.05 * g.standard_normal(s)).astype(np.float32))
    norm = lambda: ("F32", (1 + 0.1 * g.standard_normal(C)).astype(np.float32))
    t = {"model.embed_tokens.weight": r(V, C)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm()
        for n, rows in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
            t[p + f"self_attn.{n}_proj.weight"] = r(rows, C)
            if attn_b:
                t[p + f"self_attn.{n}_proj.bias"] = r(rows)
        t[p + "self_attn.o_proj.weight"] = r(C, NH * HD)
        if attn_b and not qwen:
            t[p + "self_attn.o_proj.bias"] = r(C)
        t[p + "post_attention_layernorm.weight"] = norm()
        for n, shape in (("gate", (F, C)), ("up", (F, C)), ("down", (C, F))):
            t[p + f"mlp.{n}_proj.weight"] = r(*shape)
            if c.get("mlp_bias", False):
                t[p + f"mlp.{n}_proj.bias"] = r(shape[0])
    t["model.norm.weight"] = norm()
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = r(V, C)
    return t


def make(d, c, t, shards=1):
    """Write a Hugging Face directory d: config.json c and tensors t, in shards files."""
    os.makedirs(d)
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    if shards == 1:
        write_st(os.path.join(d, "model.safetensors"), t)
        return d
    names, wmap = list(t), {}
    for i in range(shards):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: t[k] for k in names[i::shards]}
        write_st(os.path.join(d, fn), part)
        wmap.update({k: fn for k in part})
    json.dump({"metadata": {"total_size": 0}, "weight_map": wmap},
              open(os.path.join(d, "model.safetensors.index.json"), "w"))
    return d


def _rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _inv_freq(c, HD):
    """transformers' inv_freq in fp32, with llama3 scaling when configured."""
    rp = c.get("rope_parameters") or {}
    theta = rp.get("rope_theta", c.get("rope_theta", 10000.0))
    sc = rp if rp.get("rope_type", "default") != "default" else c.get("rope_scaling")
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, HD, 2, dtype=np.float32) / np.float32(HD))))
    inv = inv.astype(np.float32)
    if sc and sc.get("rope_type", sc.get("type")) == "llama3":
        f, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        wl = 2 * np.pi / inv
        scaled = np.where(wl > old / lo, inv / f, inv)
        smooth = (old / wl - lo) / (hi - lo)
        mid = ~(wl < old / hi) & ~(wl > old / lo)
        inv = np.where(mid, (1 - smooth) * scaled / f + smooth * scaled, scaled).astype(np.float32)
    return inv


def reference_logits(c, t, ids):
    """logits [B, T, V] (float64) of config c, tensors t (name -> (dtype, fp32 array))."""
    g = lambda n: t[n][1].astype(np.float64)
    has = lambda n: n in t
    C, NH, L = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    NKV, HD, eps = c.get("num_key_value_heads") or NH, C // NH, c.get("rms_norm_eps", 1e-6)
    ids = np.asarray(ids)
    B, T = ids.shape
    freqs = np.outer(np.arange(T, dtype=np.float32), _inv_freq(c, HD)).astype(np.float32)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb).astype(np.float64), np.sin(emb).astype(np.float64)
    rot = lambda x: np.concatenate([-x[..., HD // 2:], x[..., :HD // 2]], -1)
    lin = lambda x, n: x @ g(n + ".weight").T + (g(n + ".bias") if has(n + ".bias") else 0)
    x = g("model.embed_tokens.weight")[ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        p = f"model.layers.{l}."
        h = _rmsnorm(x, g(p + "input_layernorm.weight"), eps)
        q = lin(h, p + "self_attn.q_proj").reshape(B, T, NH, HD).transpose(0, 2, 1, 3)
        k = lin(h, p + "self_attn.k_proj").reshape(B, T, NKV, HD).transpose(0, 2, 1, 3)
        v = lin(h, p + "self_attn.v_proj").reshape(B, T, NKV, HD).transpose(0, 2, 1, 3)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = np.repeat(k, NH // NKV, axis=1), np.repeat(v, NH // NKV, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HD) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True)) @ v
        x = x + lin(o.transpose(0, 2, 1, 3).reshape(B, T, NH * HD), p + "self_attn.o_proj")
        h = _rmsnorm(x, g(p + "post_attention_layernorm.weight"), eps)
        gate = lin(h, p + "mlp.gate_proj")
        x = x + lin(gate / (1 + np.exp(-gate)) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = _rmsnorm(x, g("model.norm.weight"), eps)
    head = "lm_head.weight" if has("lm_head.weight") else "model.embed_tokens.weight"
    return x @ g(head).T
