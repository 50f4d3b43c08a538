"""The PEFT adapter directories io/peft_export.c writes, read by Hugging
Face's own `safetensors` package (its numpy API) and json: no torch.

test_peft_io --write DIR writes gpt2_fp32, llama_fp32, llama_bf16 and
llama_fp16 (tests/test_peft_io.c: shapes, r, alpha, dropout, and the values
value(seed, i) recomputed here). For each: exactly adapter_config.json and
adapter_model.safetensors; the config's fields (peft_type LORA, task_type
CAUSAL_LM, r, lora_alpha, lora_dropout, bias none, fan_in_fan_out true for
GPT-2 only, inference_mode, target_modules, base_model_name_or_path, no
rsLoRA/DoRA); every tensor name PEFT's save_pretrained would write and no
other, lora_A [r, in] and lora_B [out, r], the dtype, __metadata__ format pt,
and every value: fp32 and fp16 bit-identical to the recomputed ones (fp16 as
numpy rounds), bf16 the fp32 bits rounded to nearest even. Where torch,
transformers and peft import (the GPU machine; not CI), PEFT itself loads
each directory onto a tiny base of its shapes (peft_check below).

The safetensors package is imported, or pip-installed into .cache/oracle;
without network the file is read by the header (tests/e2e/common.py's
read_st) instead, and the test says so. BF16 has no numpy dtype: its shape
and dtype come from safetensors' get_slice, its bits from the header read.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import bf16_round, oracle_cache, read_st, soft_check, soft_finish  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPT2_MODULES = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
LLAMA_MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                 "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def value(seed, n):
    """tests/test_peft_io.c's value(seed, i) for i in [0, n), as float32."""
    m = 0xFFFFFFFF
    h = (np.arange(n, dtype=np.uint64) * 2654435761 + seed * 40503 + 12345) & m
    h ^= h >> 15
    h = (h * 2246822519) & m
    h ^= h >> 13
    return ((h >> 8).astype(np.float32) * np.float32(1.0 / 16777216.0)) - np.float32(0.5)


def fixtures():
    """name -> (family modules, prefix, r, alpha, dropout, dtype, base, fan_in_fan_out,
    targets, [(layer, module, in, out)])."""
    gpt2 = [(l, m, i, o) for l in (0, 1) for m, i, o in
            (("attn.c_attn", 32, 96), ("mlp.c_proj", 128, 32))]
    llama = [(l, m, i, o) for l in (0, 1, 2) for m, i, o in
             (("self_attn.q_proj", 64, 64), ("self_attn.v_proj", 64, 32),
              ("mlp.down_proj", 96, 64))]
    g = (GPT2_MODULES, "base_model.model.transformer.h.", 4, 8, 0.05, "F32", "runs/base/gpt2",
         True, ["c_attn", "mlp.c_proj"], gpt2)
    out = {"gpt2_fp32": g}
    for name, dt in (("llama_fp32", "F32"), ("llama_bf16", "BF16"), ("llama_fp16", "F16")):
        out[name] = (LLAMA_MODULES, "base_model.model.model.layers.", 8, 16, 0, dt, None,
                     False, ["down_proj", "q_proj", "v_proj"], llama)
    return out


def safetensors_module():
    """The safetensors package (imported, or pip-installed into .cache/oracle), or None."""
    err = oracle_cache(["safetensors"], python=sys.executable, no_deps=True)
    if err:
        print("note: pip could not install safetensors into .cache/oracle (" + err +
              "); reading by the header")
        return None
    import safetensors
    return safetensors


def check_dir(d, fx, st):
    mods, prefix, r, alpha, dropout, dt, base, fifo, targets, ads = fx
    name = os.path.basename(d)
    soft_check(sorted(os.listdir(d)) == ["adapter_config.json", "adapter_model.safetensors"],
               f"{name}: exactly adapter_config.json and adapter_model.safetensors "
               f"({sorted(os.listdir(d))})")
    cfg = json.load(open(os.path.join(d, "adapter_config.json")))
    want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
            "lora_dropout": dropout, "bias": "none", "fan_in_fan_out": fifo,
            "inference_mode": True, "target_modules": targets, "base_model_name_or_path": base,
            "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "rank_pattern": {}, "alpha_pattern": {}}
    for k, v in want.items():
        soft_check(k in cfg and cfg[k] == v and type(cfg[k]) is type(v),
                   f"{name}: adapter_config.json {k} = {cfg.get(k, 'missing')!r} (want {v!r})")
    path = os.path.join(d, "adapter_model.safetensors")
    expect = {}
    for layer, m, fin, fout in ads:
        seed = 16 * layer + 2 * mods.index(m)
        key = f"{prefix}{layer}.{m}"
        expect[key + ".lora_A.weight"] = value(seed, r * fin).reshape(r, fin)
        expect[key + ".lora_B.weight"] = value(seed + 1, fout * r).reshape(fout, r)
    raw = read_st(path)
    soft_check(set(raw) == set(expect), f"{name}: tensor names are the {len(expect)} PEFT keys "
               f"(extra {sorted(set(raw) - set(expect))[:3]}, missing "
               f"{sorted(set(expect) - set(raw))[:3]})")
    soft_check(not any(".default." in k for k in raw), f"{name}: no adapter name in the keys")
    if st is not None:
        from safetensors import safe_open
        with safe_open(path, framework="np") as f:
            soft_check(f.metadata() == {"format": "pt"},
                       f"{name}: __metadata__ {f.metadata()} is {{'format': 'pt'}}")
            soft_check(set(f.keys()) == set(expect), f"{name}: safetensors lists the same keys")
            for k, w in expect.items():
                if k not in f.keys():
                    continue
                sl = f.get_slice(k)
                soft_check(sl.get_dtype() == dt and list(sl.get_shape()) == list(w.shape),
                           f"{name}: {k[len(prefix):]} {sl.get_dtype()} {sl.get_shape()} "
                           f"(want {dt} {list(w.shape)})")
                if dt == "BF16":
                    got = raw[k][1]
                    soft_check(np.array_equal(got, bf16_round(w)) and
                               not np.array_equal(got, (w.view(np.uint32) >> 16).astype(np.uint16)),
                               f"{name}: {k[len(prefix):]} = fp32 values rounded to bf16 "
                               "(nearest even), not truncated")
                else:
                    got = f.get_tensor(k)
                    ref = w if dt == "F32" else w.astype(np.float16)
                    soft_check(got.dtype == ref.dtype and np.array_equal(
                        got.view(np.uint8), ref.view(np.uint8)),
                        f"{name}: {k[len(prefix):]} bit-identical ({got.dtype})")
    else:
        for k, w in expect.items():
            if k not in raw:
                continue
            rdt, got = raw[k]
            ref = (bf16_round(w) if dt == "BF16" else w if dt == "F32" else
                   w.astype(np.float16))
            soft_check(rdt == dt and got.shape == w.shape and
                       np.array_equal(got.view(np.uint8), ref.view(np.uint8)),
                       f"{name}: {k[len(prefix):]} {rdt} {list(got.shape)} bit-identical "
                       "(header read)")


def peft_check(d):
    """Where torch, transformers and peft import (the GPU machine, not CI):
    PeftModel.from_pretrained on tiny bases of the fixtures' shapes puts
    exactly our adapters on exactly our modules (no others: target_modules),
    with our values, and merge_and_unload adds scale * B @ A to a Llama
    Linear weight [out, in] and its transpose to GPT-2's Conv1D weight
    [in, out] (fan_in_fan_out)."""
    try:
        import torch
        import transformers
        from peft import PeftModel
    except ImportError as e:
        print(f"note: {e}: the PEFT load check needs torch, transformers and peft (not in CI)")
        return
    import warnings
    print("torch", torch.__version__, "transformers", transformers.__version__)
    torch.manual_seed(0)
    bases = {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4, n_inner=128)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)),
    }
    for name, fx in fixtures().items():
        mods, prefix, r, alpha, _, dt, _, fifo, _, ads = fx
        fam = name.split("_")[0]
        base = bases[fam]().eval()
        w0 = {n: q.detach().clone() for n, q in base.named_parameters()}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = PeftModel.from_pretrained(base, os.path.join(d, name))
        bad = [str(w.message)[:160] for w in caught if "missing" in str(w.message).lower()
               or "unexpected" in str(w.message).lower()]
        soft_check(not bad, f"{name}: PeftModel.from_pretrained warns of no missing or "
                   f"unexpected keys {bad[:2]}")
        lora = {n[len("base_model.model."):-len(".lora_A")] for n, _ in m.named_modules()
                if n.endswith(".lora_A")}
        inner = "transformer.h." if fam == "gpt2" else "model.layers."
        want = {f"{inner}{l}.{mod}" for l, mod, _, _ in ads}
        soft_check(lora == want, f"{name}: PEFT made adapters on exactly our {len(want)} "
                   f"modules (extra {sorted(lora - want)[:2]}, missing {sorted(want - lora)[:2]})")
        ok = True
        for l, mod, fin, fout in ads:
            sub = m.base_model.model.get_submodule(f"{inner}{l}.{mod}")
            seed = 16 * l + 2 * mods.index(mod)
            A = value(seed, r * fin).reshape(r, fin)
            B = value(seed + 1, fout * r).reshape(fout, r)
            if dt != "F32":
                A = A.astype(np.float16).astype(np.float32) if dt == "F16" else \
                    (bf16_round(A).astype(np.uint32) << 16).view(np.float32)
                B = B.astype(np.float16).astype(np.float32) if dt == "F16" else \
                    (bf16_round(B).astype(np.uint32) << 16).view(np.float32)
            ga = sub.lora_A["default"].weight.detach().float().numpy()
            gb = sub.lora_B["default"].weight.detach().float().numpy()
            ok &= np.array_equal(ga, A) and np.array_equal(gb, B)
            ok &= abs(sub.scaling["default"] - alpha / r) < 1e-12
            ok &= bool(getattr(sub, "fan_in_fan_out", False)) == fifo
        soft_check(ok, f"{name}: lora_A/lora_B.default hold our values, scaling alpha / r = "
                   f"{alpha / r}, fan_in_fan_out {fifo}")
        merged = m.merge_and_unload()
        worst = 0.0
        for l, mod, fin, fout in ads:
            seed = 16 * l + 2 * mods.index(mod)
            A = torch.from_numpy(value(seed, r * fin).reshape(r, fin))
            B = torch.from_numpy(value(seed + 1, fout * r).reshape(fout, r))
            delta = (alpha / r) * (B @ A)          # [out, in]
            if fifo:
                delta = delta.T                    # Conv1D stores [in, out]
            key = f"{inner}{l}.{mod}.weight"
            got = merged.get_parameter(key).detach() - w0[key]
            worst = max(worst, float((got - delta).abs().max()))
        tol = 1e-5 if dt == "F32" else 0.05
        soft_check(worst <= tol, f"{name}: merge_and_unload adds scale * B @ A"
                   f"{'^T (Conv1D)' if fifo else ''}: max error {worst:.2e} <= {tol}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--writer", help="the test_peft_io binary")
    p.add_argument("--adapters", help="instead of --writer: a directory it wrote")
    p.add_argument("--work", required=True)
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    d = a.adapters or os.path.join(a.work, "adapters")
    if not a.adapters:
        r = subprocess.run([a.writer, "--write", d], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"FAIL: {a.writer} --write exited {r.returncode}: {r.stderr[-2000:]}")
    st = safetensors_module()
    if st is not None:
        print("safetensors", st.__version__)
    for name, fx in fixtures().items():
        check_dir(os.path.join(d, name), fx, st)
    peft_check(d)
    if a.adapters:
        soft_finish()
        return
    # Written twice, the same bytes: the layout does not depend on the order given.
    d2 = os.path.join(a.work, "again")
    subprocess.run([a.writer, "--write", d2], capture_output=True, check=True)
    for name in fixtures():
        for fn in ("adapter_config.json", "adapter_model.safetensors"):
            same = open(os.path.join(d, name, fn), "rb").read() == \
                open(os.path.join(d2, name, fn), "rb").read()
            soft_check(same, f"{name}/{fn}: the same bytes on a second write")
    soft_finish()


if __name__ == "__main__":
    main()
